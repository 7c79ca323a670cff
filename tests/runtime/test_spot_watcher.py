"""Spot notices: the IMDSv2 protocol, an unreachable metadata service, and a notice turned into a
checkpoint plus an emergency sync within the deadline (metadata stand-in and S3 on loopback)."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from extensions.cloud.ec2_detect import ec2_evidence
from extensions.cloud.location import S3Location
from extensions.cloud.remote_tree import ManifestReader, list_objects, remote_checkpoints
from extensions.cloud.s3_sync import CheckpointManager
from extensions.cloud.spot_watcher import (
    ImdsClient, ImdsUnavailable, InterruptionHandler, SpotNotice, SpotWatcher, watcher_for,
)
from extensions.runtime.interrupt import SaveSignal
from extensions.runtime.paths import RunPaths

from s3_testing import PROJECT_ROOT, free_port, make_checkpoint, small_settings


class MetadataStandIn:
    """IMDSv2 on loopback: PUT /latest/api/token, then GET spot/instance-action with the token."""

    TOKEN = "token-abc123"

    def __init__(self):
        self.notice = None  # JSON text once the instance is marked for interruption
        self.requests: list = []  # (method, path, headers: case-insensitive)
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status: int, body: str = "") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self):
                stand_in.requests.append(("PUT", self.path, self.headers))
                if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._reply(400)
                self._reply(200, stand_in.TOKEN)

            def do_GET(self):
                stand_in.requests.append(("GET", self.path, self.headers))
                if self.headers.get("X-aws-ec2-metadata-token") != stand_in.TOKEN:
                    return self._reply(401)
                if self.path != "/latest/meta-data/spot/instance-action" or stand_in.notice is None:
                    return self._reply(404)
                self._reply(200, stand_in.notice)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def interrupt_in(self, seconds: float, action: str = "terminate") -> float:
        deadline = int(time.time() + seconds)
        stamp = datetime.fromtimestamp(deadline, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.notice = json.dumps({"action": action, "time": stamp})
        return deadline

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def imds():
    stand_in = MetadataStandIn()
    yield stand_in
    stand_in.close()


def test_imds_v2_token_then_instance_action(imds):
    client = ImdsClient(imds.url)
    assert client.instance_action() is None  # 404: no notice
    deadline = imds.interrupt_in(100, "stop")
    notice = SpotNotice.parse(client.instance_action(), time.time(), 120)
    assert notice.action == "stop" and notice.deadline_unix == deadline
    puts = [r for r in imds.requests if r[0] == "PUT"]
    assert len(puts) == 1 and int(puts[0][2]["X-aws-ec2-metadata-token-ttl-seconds"]) > 0  # token reused
    assert all(r[2].get("X-aws-ec2-metadata-token") == imds.TOKEN for r in imds.requests if r[0] == "GET")

    imds.TOKEN = "rotated"  # an expired token is answered 401: the client fetches a new one once
    assert client.instance_action() is not None
    assert len([r for r in imds.requests if r[0] == "PUT"]) == 2


def test_notice_without_readable_time_gets_the_default_deadline():
    notice = SpotNotice.parse('{"action": "terminate", "time": "soon"}', 1000.0, 120)
    assert (notice.action, notice.deadline_unix) == ("terminate", 1120.0)


def test_unreachable_metadata_service_is_logged_once_and_polling_goes_on(caplog):
    closed_port = free_port()
    with pytest.raises(ImdsUnavailable):
        ImdsClient(f"http://127.0.0.1:{closed_port}").instance_action()
    watcher = SpotWatcher(ImdsClient(f"http://127.0.0.1:{closed_port}", timeout_s=0.2), 0.02, lambda n: None)
    with caplog.at_level(logging.INFO, logger="extensions.cloud.spot_watcher"):
        watcher.start()
        time.sleep(0.5)
        assert watcher.running
        watcher.stop(timeout=5)
    assert watcher.polls >= 5 and watcher.reachable is False
    warnings = [r for r in caplog.records if "no instance metadata service" in r.getMessage()]
    assert len(warnings) == 1


def fake_trainer(paths: RunPaths, stop: threading.Event, events: list) -> None:
    """A training loop in its own 'process': it only shares the flag files with the watcher."""
    signal_ = SaveSignal.for_run(paths)
    step = 0
    while not stop.is_set():
        step += 1
        time.sleep(0.02)
        if signal_.save_requested():
            target = make_checkpoint(paths.sft_checkpoint(step), "sft", step, payload_bytes=3 * 1024 * 1024)
            signal_.acknowledge(target)
            events.append(("saved", step, time.time()))
            if signal_.stop_requested():
                events.append(("stopped", step, time.time()))
                return


def test_spot_notice_leads_to_checkpoint_and_emergency_sync_within_deadline(s3, imds, tmp_path):
    cfg = small_settings(tmp_path / "run", sync_interval_s=600, spot_poll_interval_s=0.05,
                         metadata_endpoint=imds.url, save_ack_timeout_s=5, emergency_reserve_s=2)
    paths = RunPaths(tmp_path / "run")
    make_checkpoint(paths.sft_checkpoint(0), "sft", 0)
    location = S3Location(s3["bucket"], "runs", "test-run")
    manager = CheckpointManager(cfg.checkpoint, paths, location)
    manager.start()  # periodic sync, first round now
    handler = InterruptionHandler(SaveSignal.for_run(paths), manager, cfg.checkpoint, paths.spot_interruption_report)
    watcher = SpotWatcher(ImdsClient(imds.url), cfg.checkpoint.spot_poll_interval_s, handler.handle)
    stop, events = threading.Event(), []
    trainer = threading.Thread(target=fake_trainer, args=(paths, stop, events), daemon=True)
    trainer.start()
    watcher.start()
    try:
        time.sleep(0.3)
        assert not handler.reports and not events  # no notice yet: nothing happens
        deadline = imds.interrupt_in(12)
        end = time.time() + 20
        while not handler.reports and time.time() < end:
            time.sleep(0.05)
    finally:
        stop.set()
        watcher.stop(timeout=10)
        manager.stop(final_sync=False, timeout=30)
        trainer.join(10)
    assert handler.reports, "the notice was not handled"
    report = handler.reports[0]
    assert report.deadline_unix == deadline and report.action == "terminate"
    assert report.save_acknowledged and report.sync_ok, report
    assert report.within_deadline and report.finished_unix < deadline
    assert [kind for kind, *_ in events] == ["saved", "stopped"]
    saved_step = events[0][1]
    sealed = [c.rel_dir for c in remote_checkpoints(list_objects(s3["client"], location),
                                                    ManifestReader(s3["client"], location)) if c.complete]
    assert f"checkpoints/sft/checkpoint-{saved_step}" in sealed
    written = json.loads(paths.spot_interruption_report.read_text())
    assert written["within_deadline"] and written["checkpoint"].endswith(f"checkpoint-{saved_step}")


def test_watch_process_answers_sigterm_with_save_request_and_emergency_sync(s3, imds, tmp_path):
    paths = RunPaths(tmp_path / "run")
    make_checkpoint(paths.sft_checkpoint(1), "sft", 1)
    (paths.logs).mkdir(parents=True)
    SaveSignal.for_run(paths).request("left by a killed run", stop=True)  # must be cleared at start
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    command = [sys.executable, str(PROJECT_ROOT / "checkpoint_manager.py"), "--action", "watch", "--smoke",
               "--bucket", s3["bucket"], "--prefix", "runs", "--run-id", "test-run", "--local-dir", str(paths.root),
               "--set", f"checkpoint.metadata_endpoint={imds.url}", "--set", "checkpoint.spot_poll_interval_s=0.1",
               "--set", "checkpoint.sync_interval_s=600", "--set", "checkpoint.save_ack_timeout_s=0.5",
               "--set", "checkpoint.multipart_chunk_mb=5"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    location = S3Location(s3["bucket"], "runs", "test-run")
    try:
        end = time.time() + 60
        while time.time() < end and "checkpoints/sft/checkpoint-1/manifest.json" not in list_objects(s3["client"], location):
            time.sleep(0.1)  # the first periodic round
        assert not SaveSignal.for_run(paths).flag_path.exists(), "a stale save request survived the restart"
        make_checkpoint(paths.sft_checkpoint(2), "sft", 2)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    assert "checkpoint requested" in output and "no save acknowledged" in output
    assert SaveSignal.for_run(paths).flag_path.exists()  # the request a trainer would have served
    assert "checkpoints/sft/checkpoint-2/manifest.json" in list_objects(s3["client"], location)
    assert json.loads(paths.spot_interruption_report.read_text())["action"] == "sigterm"


def fake_sys(root: Path, **files: str) -> Path:
    """A /sys tree holding only ``files`` (relative path with '__' for '/': text)."""
    for name, text in files.items():
        path = root / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root


DMI = "devices__virtual__dmi__id__"


@pytest.mark.parametrize("files, evidence", [
    ({DMI + "sys_vendor": "Amazon EC2", DMI + "board_vendor": "Amazon EC2"}, "sys_vendor"),  # Nitro
    ({"hypervisor__uuid": "ec2e1916-9099-7caf-fd21-012345abcdef", DMI + "sys_vendor": "Xen"}, "hypervisor/uuid"),
    ({DMI + "product_uuid": "EC2E1916-9099-7CAF-FD21-012345ABCDEF"}, "product_uuid"),
    ({DMI + "sys_vendor": "LENOVO", DMI + "product_uuid": "4c4c4544-0042-3510-8051-b4c04f4d4e32"}, None),
    ({DMI + "sys_vendor": "QEMU", "hypervisor__uuid": "0a1b2c3d-ec20-0000-0000-000000000000"}, None),
    ({}, None),  # a container with an empty /sys
])
def test_ec2_is_recognised_from_sys_files_only(tmp_path, files, evidence):
    found = ec2_evidence(fake_sys(tmp_path, **files))
    assert (found is None) if evidence is None else (evidence in found)


@pytest.mark.parametrize("mode, on_ec2, polls", [
    ("auto", False, False), ("auto", True, True), ("on", False, True), ("off", True, False),
])
def test_spot_watch_mode_decides_whether_metadata_is_polled(imds, tmp_path, mode, on_ec2, polls):
    sys_root = fake_sys(tmp_path, **({DMI + "sys_vendor": "Amazon EC2"} if on_ec2 else {DMI + "sys_vendor": "LENOVO"}))
    cfg = small_settings(tmp_path / "run", metadata_endpoint=imds.url, spot_poll_interval_s=0.02, spot_watch=mode)
    watcher, polling = watcher_for(cfg.checkpoint, lambda notice: None, sys_root)
    assert polling.enabled is polls and (watcher is not None) is polls
    if watcher is not None:
        watcher.start()
        end = time.time() + 10
        while not imds.requests and time.time() < end:
            time.sleep(0.02)
        watcher.stop(timeout=5)
    assert bool(imds.requests) is polls
    if not polls:
        assert mode in polling.reason or "not an EC2 instance" in polling.reason


def test_unknown_spot_watch_mode_is_a_config_error(tmp_path):
    from extensions.config import ConfigError

    with pytest.raises(ConfigError, match="spot_watch"):
        small_settings(tmp_path, spot_watch="sometimes")


@pytest.mark.skipif(ec2_evidence() is not None, reason="this machine is an EC2 instance")
def test_watch_process_off_ec2_never_touches_the_metadata_address(imds, tmp_path):
    """The quickstart on a laptop: the watcher runs beside the stages, with no bucket, and must not
    send a single request to the metadata address."""
    paths = RunPaths(tmp_path / "run")
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    command = [sys.executable, str(PROJECT_ROOT / "checkpoint_manager.py"), "--action", "watch", "--smoke",
               "--local-dir", str(paths.root), "--set", f"checkpoint.metadata_endpoint={imds.url}",
               "--set", "checkpoint.spot_poll_interval_s=0.05"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:  # wait until it is watching, then give it time to poll (it must not)
            lines.append(line)
            if "watching" in line:
                break
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        output = "".join(lines) + proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    assert "no metadata polling (not an EC2 instance" in output
    assert imds.requests == []
