#!/usr/bin/env python3
"""How long an emergency sync of a 7B LoRA checkpoint takes, against the two-minute spot notice.

    python bench/emergency_sync.py [--adapter-mb 160] [--optimizer-mb 320] [--chunk-mb 16]

Writes a checkpoint the size of a rank-16 LoRA of Qwen2.5-Coder-7B with its AdamW state (random
bytes: ~160 MB adapter, ~320 MB optimizer), starts a loopback S3 server (moto) and times:

  1. the emergency sync path (CheckpointManager.emergency_sync: hashing, multipart, concurrent parts,
     several files at once, manifest last) for a checkpoint not yet uploaded;
  2. the same when the periodic sync already sent it (what a notice usually finds);
  3. a single-stream upload of the same files: one put_object per file, no multipart, sequential.

Prints a markdown table. A loopback moto server is CPU-bound Python: absolute numbers say more about
this machine than about S3, the ratio between the rows is the point. No GPU needed.
"""
from __future__ import annotations

import argparse
import logging
import os
import platform
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from extensions.runtime import checkpoints as ck  # noqa: E402
from extensions.cloud.fingerprint import compute_fingerprint  # noqa: E402
from extensions.cloud.location import S3Location  # noqa: E402
from extensions.cloud.s3_sync import CheckpointManager  # noqa: E402
from extensions.config import load_config  # noqa: E402
from extensions.runtime.paths import RunPaths  # noqa: E402

NOTICE_S = 120.0


def write_random(path: Path, megabytes: int) -> None:
    with open(path, "wb") as handle:
        for _ in range(megabytes):
            handle.write(os.urandom(1024 * 1024))


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node()}: {os.cpu_count()} CPU(s), {cpu}, Python {platform.python_version()}"


def start_s3():
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    return server


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapter-mb", type=int, default=160)
    parser.add_argument("--optimizer-mb", type=int, default=320)
    parser.add_argument("--chunk-mb", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    server = start_s3()
    import boto3

    client = boto3.client("s3")
    with tempfile.TemporaryDirectory(prefix="emergency-sync-") as tmp:
        paths = RunPaths(Path(tmp))
        checkpoint = paths.sft_checkpoint(100)
        checkpoint.mkdir(parents=True)
        print(f"writing {args.adapter_mb + args.optimizer_mb} MB of random checkpoint files ...", file=sys.stderr)
        write_random(checkpoint / "adapter_model.safetensors", args.adapter_mb)
        write_random(checkpoint / "optimizer.pt", args.optimizer_mb)
        ck.write_meta(checkpoint, stage="sft", config="default.yaml", base_model="Qwen/Qwen2.5-Coder-7B-Instruct",
                      data="bench", step=100)
        ck.finalize(checkpoint)
        total_mb = sum(p.stat().st_size for p in checkpoint.iterdir()) / 1e6

        cfg = load_config(None, [f"run.root={tmp}", "run.run_id=bench", f"checkpoint.multipart_chunk_mb={args.chunk_mb}",
                                 f"checkpoint.upload_concurrency={args.concurrency}", "checkpoint.sync_dirs=[checkpoints]"])
        rows = []

        client.create_bucket(Bucket="bench-emergency")
        manager = CheckpointManager(cfg.checkpoint, paths, S3Location("bench-emergency", "bench", "bench"))
        start = time.time()
        report = manager.emergency_sync(deadline_unix=start + NOTICE_S)
        cold = time.time() - start
        if not report.ok:
            print(f"emergency sync incomplete: {report.summary()}", file=sys.stderr)
        rows.append(("emergency sync, checkpoint not yet uploaded (hash + multipart, "
                     f"{args.chunk_mb} MB parts x {args.concurrency} threads)", cold, report.ok))

        start = time.time()
        chunk = args.chunk_mb * 1024 * 1024
        for path in sorted(checkpoint.iterdir()):
            compute_fingerprint(path, chunk, chunk)
        rows.append(("of which: hashing the files (sha256 + S3 ETag), no upload", time.time() - start, True))

        start = time.time()
        report = manager.emergency_sync(deadline_unix=start + NOTICE_S)
        rows.append(("emergency sync, periodic sync already sent it", time.time() - start, report.ok))

        client.create_bucket(Bucket="bench-single-stream")
        start = time.time()
        for path in sorted(checkpoint.iterdir()):
            with open(path, "rb") as body:
                client.put_object(Bucket="bench-single-stream", Key=f"bench/{path.name}", Body=body)
        rows.append(("single stream: put_object per file, sequential, no multipart", time.time() - start, True))
    server.stop()

    print(f"\nEmergency sync of a {total_mb:.0f} MB checkpoint ({args.adapter_mb} MiB adapter + "
          f"{args.optimizer_mb} MiB optimizer state) to loopback S3 (moto)\n")
    print(f"Machine: {machine()}\n")
    print("| upload | seconds | MB/s | share of the 120 s notice | complete |")
    print("|---|---:|---:|---:|---|")
    for name, seconds, ok in rows:
        rate = f"{total_mb / seconds:.0f}" if "already" not in name and seconds > 0 else "-"
        print(f"| {name} | {seconds:.1f} | {rate} | {100 * seconds / NOTICE_S:.0f}% | {'yes' if ok else 'NO'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
