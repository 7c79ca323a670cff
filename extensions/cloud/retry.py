"""Exponential backoff for S3 calls, and telling "the endpoint is gone" from "this call failed"."""
from __future__ import annotations

import logging
import random
import time
from typing import Callable, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)

# The attribute naming the call (e.g. "list bucket") on the exception ``with_backoff`` gives up on,
# so that the one-line report (failures.py) can say which operation failed.
OPERATION_ATTRIBUTE = "s3_operation"

# Errors no retry can fix: report them at once instead of backing off for minutes.
_PERMANENT_CODES = (
    "NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidBucketName",
    "AllAccessDisabled", "ExpiredToken", "InvalidToken",
)


def error_chain(exc: BaseException):
    """The exception, then its causes and contexts, each once."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_connection_error(exc: BaseException) -> bool:
    """True when the endpoint could not be reached at all (refused, reset, timed out, DNS)."""
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import HTTPClientError

    for err in error_chain(exc):
        if isinstance(err, (BotoConnectionError, HTTPClientError, ConnectionError, TimeoutError)):
            return True
        text = str(err)
        if "Could not connect to the endpoint" in text or "Connection was closed" in text:
            return True
    return False


def is_permanent(exc: BaseException) -> bool:
    for err in error_chain(exc):
        code = getattr(err, "response", {}).get("Error", {}).get("Code") if hasattr(err, "response") else None
        if code in _PERMANENT_CODES:
            return True
        if any(name in str(err) for name in _PERMANENT_CODES):
            return True
    return False


def with_backoff(call: Callable[[], T], *, what: str, attempts: int, base_s: float, cap_s: float,
                 should_stop: Callable[[], bool] = lambda: False) -> T:
    """Run ``call``; on a transient failure wait base, 2*base, 4*base ... (capped, jittered) and retry."""
    attempts = max(1, attempts)
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - boto3 raises many unrelated types
            if is_permanent(exc) or attempt == attempts or should_stop():
                if not hasattr(exc, OPERATION_ATTRIBUTE):
                    try:
                        setattr(exc, OPERATION_ATTRIBUTE, what)
                    except AttributeError:  # an exception type with __slots__: the report names less
                        pass
                if attempt > 1:
                    log.info("%s failed after %d attempt(s): %s", what, attempt, _one_line(exc))
                raise
            delay = min(cap_s, base_s * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
            log.info("%s failed (attempt %d/%d: %s); retrying in %.1f s", what, attempt, attempts,
                     _one_line(exc), delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def _one_line(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text[:160]}"
