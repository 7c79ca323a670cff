"""A Hugging Face hub stand-in on loopback for tests, and a guard that no connection leaves the machine.

``FakeHub`` answers the requests ``HfApi.create_repo`` and ``HfApi.upload_folder`` (huggingface_hub
2.4) make for small files, and records them:

- ``POST /api/repos/create`` (JSON: name, organization, visibility) -> ``{"url": ...}``
- ``POST /api/validate-yaml`` (a README.md's text, before it is uploaded) -> no errors
- ``POST /api/models/{repo}/preupload/{revision}`` (JSON: each file's path, size, first bytes) ->
  every file ``uploadMode: regular``, so its content travels inline in the commit
- ``POST /api/models/{repo}/commit/{revision}`` (NDJSON: a header line, then one ``file`` line per
  file with its base64 content) -> ``{"commitUrl", "commitOid"}``

Anything else is recorded as unexpected and answered 404. ``FakeHub(refuse=401)`` answers every
request with that status. ``loopback_only_env`` gives a subprocess the loopback guard.
"""
from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional

from loopback_guard import sitecustomize_text


def loopback_only_env(directory: Path, env: dict) -> dict:
    """``env`` for a Python subprocess whose sockets reach loopback addresses only."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(sitecustomize_text())
    path = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": f"{directory}:{path}" if path else str(directory)}


class FakeHub:
    """``with FakeHub() as hub:`` -> ``hub.url`` for HF_ENDPOINT; ``hub.files`` what was committed."""

    def __init__(self, refuse: Optional[int] = None):
        self.refuse = refuse
        self.repos: list[dict] = []
        self.files: dict[str, dict[str, bytes]] = {}  # repo -> path -> content
        self.validated: list[str] = []
        self.commits: list[dict] = []
        self.tokens: set[str] = set()
        self.unexpected: list[str] = []
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet test output
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    data = b""
                    while True:
                        size = int(self.rfile.readline().strip(), 16)
                        if size == 0:
                            self.rfile.readline()
                            return data
                        data += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _answer(self, status: int, payload: dict) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self) -> None:
                body = self._body()
                hub.requests.append(f"{self.command} {self.path}")
                auth = self.headers.get("Authorization", "")
                if auth.startswith("Bearer "):
                    hub.tokens.add(auth[len("Bearer "):])
                if hub.refuse is not None:
                    self._answer(hub.refuse, {"error": "Invalid credentials in Authorization header"})
                    return
                try:
                    status, payload = hub._route(self.command, self.path.split("?", 1)[0], body)
                except (ValueError, KeyError) as exc:
                    status, payload = 400, {"error": f"bad request: {exc}"}
                self._answer(status, payload)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _route(self, method: str, path: str, body: bytes) -> tuple[int, dict]:
        parts = path.strip("/").split("/")
        if method == "POST" and path == "/api/repos/create":
            request = json.loads(body)
            repo = f"{request['organization']}/{request['name']}"
            self.repos.append(request)
            self.files.setdefault(repo, {})
            return 200, {"url": f"{self.url}/{repo}"}
        if method == "POST" and path == "/api/validate-yaml":
            self.validated.append(json.loads(body)["content"])
            return 200, {"errors": [], "warnings": []}
        if method == "POST" and len(parts) == 6 and parts[:2] == ["api", "models"] and parts[4] == "preupload":
            repo = f"{parts[2]}/{parts[3]}"
            if repo not in self.files:
                return 404, {"error": "Repository not found"}
            listed = json.loads(body)["files"]
            return 200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
                                   for f in listed]}
        if method == "POST" and len(parts) == 6 and parts[:2] == ["api", "models"] and parts[4] == "commit":
            repo = f"{parts[2]}/{parts[3]}"
            if repo not in self.files:
                return 404, {"error": "Repository not found"}
            lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
            header = next(line["value"] for line in lines if line["key"] == "header")
            added = {}
            for line in lines:
                if line["key"] == "file":
                    assert line["value"]["encoding"] == "base64"
                    added[line["value"]["path"]] = base64.b64decode(line["value"]["content"])
                elif line["key"] != "header":
                    raise ValueError(f"operation {line['key']} is not served here")
            self.files[repo].update(added)
            self.commits.append({"repo": repo, "revision": parts[5], "summary": header["summary"],
                                 "paths": sorted(added)})
            oid = f"{len(self.commits):040x}"
            return 200, {"commitUrl": f"{self.url}/{repo}/commit/{oid}", "commitOid": oid}
        self.unexpected.append(f"{method} {path}")
        return 404, {"error": f"not served here: {method} {path}"}

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


def hub_env(hub: FakeHub, env: dict, token: str = "hf_test_token") -> dict:
    """``env`` with the hub stand-in as endpoint and a token; no telemetry, no stored token."""
    cleaned = {k: v for k, v in env.items() if k not in ("HF_HUB_OFFLINE", "HF_TOKEN_PATH")}
    return {**cleaned, "HF_ENDPOINT": hub.url, "HF_TOKEN": token, "HF_HUB_DISABLE_TELEMETRY": "1"}


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` by its relative path, as upload_folder names them."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}

