"""One readable line for a failed S3 operation: the endpoint, the operation, the likely cause.

botocore's exceptions are precise but long (a chained traceback of urllib3, botocore and boto3
frames); someone whose restore failed needs to know which of four things to fix: the endpoint, the
credentials, the bucket, or the permissions.
"""
from __future__ import annotations

import os
from typing import Optional

from .retry import OPERATION_ATTRIBUTE, error_chain, is_connection_error

_CREDENTIALS_REJECTED = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
                         "TokenRefreshRequired")
_ACCESS_DENIED = ("AccessDenied", "AllAccessDisabled", "403", "Forbidden")
_BUCKET_MISSING = ("NoSuchBucket",)


def _error_code(exc: BaseException) -> Optional[str]:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code") or "") or None
    return None


def is_s3_failure(exc: BaseException) -> bool:
    """True for errors of the AWS SDK (or of the connection under it), which ``describe`` explains."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        return False
    return any(isinstance(err, (BotoCoreError, ClientError)) for err in error_chain(exc)) or is_connection_error(exc)


def likely_cause(exc: BaseException, bucket: Optional[str] = None) -> str:
    from botocore.exceptions import NoCredentialsError, PartialCredentialsError

    the_bucket = f"bucket '{bucket}'" if bucket else "the bucket"
    for err in error_chain(exc):
        if isinstance(err, (NoCredentialsError, PartialCredentialsError)):
            return ("no AWS credentials found (attach an instance profile, run 'aws configure', or set "
                    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)")
        code = _error_code(err)
        if code in _BUCKET_MISSING:
            return (f"{the_bucket} does not exist (create it once: python checkpoint_manager.py "
                    f"--action setup --bucket {bucket or 'B'})")
        if code in _CREDENTIALS_REJECTED:
            return f"credentials rejected by the endpoint ({code}): check the access key, secret and session token"
        if code in _ACCESS_DENIED:
            return (f"access denied ({code}): the credentials lack permission on {the_bucket} "
                    "(s3:ListBucket, s3:GetObject, s3:PutObject, s3:DeleteObject)")
    if is_connection_error(exc):
        return "endpoint unreachable (network, AWS_ENDPOINT_URL, or the store is down)"
    first_line = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"{type(exc).__name__}: {first_line}"


def endpoint_of(client) -> str:
    """The URL the client talks to (for the message), falling back to what the environment names."""
    url = getattr(getattr(client, "meta", None), "endpoint_url", None)
    return url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "the S3 endpoint"


def describe(exc: BaseException, action: str, endpoint: str, bucket: Optional[str] = None) -> str:
    """``S3 restore (list bucket) at http://...: endpoint unreachable (...)``."""
    call = getattr(exc, OPERATION_ATTRIBUTE, None)
    operation = f"{action} ({call})" if call else action
    return f"S3 {operation} at {endpoint} failed: {likely_cause(exc, bucket)}"
