"""A real S3 endpoint on loopback for tests: moto's ThreadedMotoServer, reached through boto3 with
AWS_ENDPOINT_URL and dummy credentials (never a patched client), plus small checkpoint builders."""
from __future__ import annotations

import hashlib
import json
import logging
import socket
import uuid
from pathlib import Path

from extensions.runtime import checkpoints as ck
from extensions.config import load_config

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_moto(port: int):
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server


def point_boto3_at(url: str, monkeypatch) -> str:
    """Dummy credentials and AWS_ENDPOINT_URL for ``url``; returns a fresh bucket name."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    return f"kernel-rl-test-{uuid.uuid4().hex[:10]}"


def small_settings(root: Path, **checkpoint):
    overrides = [f"run.root={root}", "run.run_id=test-run", "checkpoint.prefix=runs",
                 "checkpoint.multipart_chunk_mb=5", "checkpoint.retry_backoff_s=0.01",
                 "checkpoint.retry_backoff_max_s=0.05", "checkpoint.max_retries=2",
                 "checkpoint.sync_interval_s=0.2", "checkpoint.upload_concurrency=4"]
    overrides += [f"checkpoint.{key}={value}" for key, value in checkpoint.items()]
    return load_config(PROJECT_ROOT / "configs" / "smoke.yaml", overrides)


def make_checkpoint(directory: Path, stage: str, index, payload_bytes: int = 2048, complete: bool = True,
                    seed: str = "") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    block = hashlib.sha256(f"{directory.name}{seed}".encode()).digest()
    (directory / "adapter_model.safetensors").write_bytes((block * (payload_bytes // 32 + 1))[:payload_bytes])
    (directory / "nested").mkdir(exist_ok=True)
    (directory / "nested" / "trainer_state.json").write_text(json.dumps({"index": index, "seed": seed}))
    ck.write_meta(directory, stage=stage, config="smoke.yaml", base_model="tiny", data="fake",
                  step=index if stage == "sft" else None, round_index=index if stage == "rl" else None)
    if complete:
        ck.finalize(directory)
    return directory


