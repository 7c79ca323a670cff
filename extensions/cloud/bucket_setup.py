"""Create (or bring up to standard) the bucket a run is mirrored to.

Versioning keeps an overwritten or deleted object recoverable; default encryption (SSE-S3) keeps
ETags equal to content md5s, which sync relies on; a lifecycle rule expires noncurrent versions after
N days and aborts multipart uploads a killed machine left behind. Safe to run again.
"""
from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def setup_bucket(client: Any, bucket: str, noncurrent_days: int) -> list[str]:
    """Returns what was done, one line per setting."""
    from botocore.exceptions import ClientError

    done = []
    try:
        client.head_bucket(Bucket=bucket)
        done.append(f"bucket {bucket} exists")
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
            raise
        region = client.meta.region_name
        kwargs: dict[str, Any] = {"Bucket": bucket}
        if region and region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        client.create_bucket(**kwargs)
        done.append(f"bucket {bucket} created in {region or 'the default region'}")
    client.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration={
        "BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True, "RestrictPublicBuckets": True,
    })
    done.append("public access blocked")
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    done.append("versioning enabled")
    client.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={
        "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}],
    })
    done.append("default encryption SSE-S3 (AES256)")
    client.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [{
        "ID": "kernel-rl-expire-noncurrent",
        "Filter": {"Prefix": ""},
        "Status": "Enabled",
        "NoncurrentVersionExpiration": {"NoncurrentDays": max(1, int(noncurrent_days))},
        "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1},
    }]})
    done.append(f"noncurrent versions expire after {max(1, int(noncurrent_days))} day(s); "
                "abandoned multipart uploads aborted after 1 day")
    for line in done:
        log.info("setup: %s", line)
    return done
