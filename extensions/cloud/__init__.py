"""Spot-proof runs: S3 mirroring of a run, spot-interruption handling, restore from S3.

    location.py     where a run lives in S3 and the boto3 client that reaches it
    fingerprint.py  size + sha256 + S3 ETag of a local file, computed once per change
    retry.py        exponential backoff and the "endpoint is down" test
    s3_sync.py      CheckpointManager: periodic and emergency sync, manifest-last ordering
    retention.py    keep the newest K complete checkpoints per stage in S3
    restore.py      list remote checkpoints and restore complete ones, verified
    bucket_setup.py bucket with versioning, SSE-S3 and noncurrent-version expiry
    spot_watcher.py IMDSv2 poller and the interruption handler (save, wait, emergency sync)
    actions.py      the actions of checkpoint_manager.py and resume_training.py (sync, restore, watch)
"""
