"""Publishing a folder to the Hugging Face hub: the repository created if needed, the files uploaded.

``push_folder`` uses ``huggingface_hub.HfApi``: ``create_repo(exist_ok=True)`` (private unless
asked otherwise), then ``upload_folder`` of the folder's files; a training checkpoint is published
without its resume state (``TRAINING_STATE_PATTERNS``). The endpoint is
``$HF_ENDPOINT`` read when the push starts (the library itself reads it once, on import); the token
is ``token``, else the library's own lookup (``$HF_TOKEN``, then the one ``hf auth login`` stored).
Every failure, whatever its cause, is one ``HubPushError`` whose text fits on one line.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..config import CheckpointConfig
from ..runtime.paths import RunPaths
from .model_card import refresh_model_card

_STATUS_HINTS = {
    401: "the token was refused: set HF_TOKEN to a token with write access",
    403: "the token may not write to this owner",
    404: "the repository or its owner does not exist",
}


class HubPushError(RuntimeError):
    """A push that did not complete; the local files are untouched."""


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _reason(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(status, int):
        hint = _STATUS_HINTS.get(status)
        url = getattr(getattr(response, "request", None), "url", None) or getattr(response, "url", "")
        return f"HTTP {status} from {url}" + (f" ({hint})" if hint else "")
    return f"{type(exc).__name__}: {_one_line(exc)}"


# What a training checkpoint holds for resuming, not for loading: optimizer and scheduler state, RNG
# streams, curriculum and objective state, and the run's own records (meta.json and config.yaml name
# local paths and the bucket; the manifest lists files that are not published).
TRAINING_STATE_PATTERNS = ("optimizer.pt", "scheduler.pt", "rng_state_rank*.pt", "trainer_state.json",
                           "curriculum.json", "objective_state.json", "meta.json", "config.yaml", "manifest.json")


def push_folder(folder: Path, repo_id: str, private: bool, token: Optional[str] = None,
                ignore_patterns: Sequence[str] = ()) -> str:
    """Upload the files of ``folder`` (but those matching ``ignore_patterns``) to the model
    repository ``repo_id``; the commit's URL."""
    folder = Path(folder)
    if not folder.is_dir():
        raise HubPushError(f"{folder} is not a directory")
    from huggingface_hub import HfApi
    from huggingface_hub.utils import get_token

    if not token and not get_token():
        raise HubPushError("no Hugging Face token: set HF_TOKEN or run `hf auth login`")
    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=token or None)
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        commit = api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model",
                                   commit_message=f"Upload {folder.name}", ignore_patterns=list(ignore_patterns) or None)
    # Any failure (HTTP status, refused connection, DNS, TLS, a Xet transfer) ends the push the same
    # way: the caller reports one line and keeps the files, so nothing escapes as a traceback.
    except Exception as exc:  # noqa: BLE001
        raise HubPushError(_reason(exc)) from exc
    return str(getattr(commit, "commit_url", commit))


def push_final_adapter(directory: Path, hub: CheckpointConfig, *, paths: Optional[RunPaths] = None,
                       stage: str = "rl", log: Callable[[str], None] = print) -> bool:
    """Push a stage's final adapter if ``hub.push_to_hub``, its model card refreshed first (``paths``:
    the run, for the card's data and evaluation). A failure is one line, never an exception, since
    the trained adapter on disk is what matters. True when pushed."""
    if not hub.push_to_hub:
        return False
    try:
        refresh_model_card(directory, paths=paths, repo_id=hub.hub_model_id)
    except Exception as exc:  # noqa: BLE001 - the card is documentation; the push goes on with the old one
        log(f"[{stage}] warning: model card not refreshed: {type(exc).__name__}: {exc}")
    try:
        url = push_folder(directory, hub.hub_model_id, hub.hub_private, ignore_patterns=TRAINING_STATE_PATTERNS)
    except HubPushError as exc:
        log(f"[{stage}] warning: push to hub failed: {exc}; the trained adapter is at {directory} "
            f"(rerun `train_integrated.py --stage {stage}` to push it again)")
        return False
    log(f"[{stage}] pushed {directory} to {hub.hub_model_id} ({url})")
    return True
