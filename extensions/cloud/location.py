"""Where a run is mirrored in S3 (``s3://BUCKET/PREFIX/RUN_ID/``) and the client that reaches it.

Credentials come from boto3's standard chain (environment, shared files, instance profile). The
endpoint comes from ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3`` when set, which botocore (>= 1.31)
honours natively: that is how S3-compatible stores and the loopback test server are reached.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..config.sections import PipelineConfig


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str
    run_id: str

    def __post_init__(self) -> None:
        if not self.bucket:
            raise ValueError("no S3 bucket given: pass --bucket, set checkpoint.bucket or KERNEL_RL_BUCKET")
        if not self.run_id or "/" in self.run_id:
            raise ValueError(f"run id {self.run_id!r} must be a non-empty name without '/'")

    @property
    def root_key(self) -> str:
        """Key prefix of the run, ending in '/'."""
        parts = [p for p in self.prefix.strip("/").split("/") if p] + [self.run_id]
        return "/".join(parts) + "/"

    def key_for(self, relative: str) -> str:
        return self.root_key + relative.lstrip("/")

    def relative(self, key: str) -> str:
        if not key.startswith(self.root_key):
            raise ValueError(f"key {key!r} is outside the run prefix {self.root_key!r}")
        return key[len(self.root_key):]

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.root_key}"


def location_from_config(cfg: PipelineConfig, bucket: Optional[str] = None, prefix: Optional[str] = None,
                         run_id: Optional[str] = None) -> S3Location:
    """Command-line values win over the config's ``checkpoint`` and ``run`` sections."""
    return S3Location(
        bucket=bucket or cfg.checkpoint.bucket or "",
        prefix=cfg.checkpoint.prefix if prefix is None else prefix,
        run_id=run_id or cfg.run.run_id,
    )


def make_s3_client(settings) -> Any:
    """A thread-safe S3 client; ``settings`` is the config's ``checkpoint`` section.

    botocore's own retries are kept to one extra attempt: the caller's backoff (retry.py) owns the
    retry policy so that an endpoint outage costs a bounded, logged number of tries.
    """
    import boto3
    from botocore.config import Config

    pool = max(10, settings.file_concurrency * max(1, settings.upload_concurrency) + 4)
    config = Config(
        retries={"total_max_attempts": 2, "mode": "standard"},
        connect_timeout=10,
        read_timeout=120,
        max_pool_connections=pool,
    )
    return boto3.client("s3", config=config)


def transfer_config(settings) -> Any:
    from boto3.s3.transfer import TransferConfig

    chunk = chunk_bytes(settings)
    return TransferConfig(
        multipart_threshold=chunk,
        multipart_chunksize=chunk,
        max_concurrency=max(1, settings.upload_concurrency),
        use_threads=True,
    )


def chunk_bytes(settings) -> int:
    return max(5, int(settings.multipart_chunk_mb)) * 1024 * 1024
