"""Which config keys decide a stage's result, and a fingerprint of them.

A finished stage is reused only when the keys that shaped its result are unchanged. Keys that only
say where things go, how often to log or save, or how fast to compute the same numbers do not count:

- never: ``run.root``, ``run.run_id`` and the whole ``checkpoint`` section (S3 sync, spot
  handling, hub publishing); ``model.device_map`` and ``model.attn_implementation`` (placement and kernels);
  ``source`` (the file name: the values count, not where they were read).
- ``sft``: ``run.seed``, ``model``, ``lora`` and ``sft``, except ``sft.save_every_steps``,
  ``eval_every_steps``, ``keep_last_checkpoints``, ``log_every_steps`` and ``gradient_checkpointing``.
- ``rl``: the ``sft`` keys (RL trains with some of them and starts from the SFT adapter), ``rl`` and
  ``verifier`` (rewards), except ``rl.keep_last_rounds``, ``verify_chunk_size``,
  ``overlap_verification``, ``generation_batch_size``, ``cuda_graphs``, ``compile_decode`` and ``verifier.workers``,
  ``prespawn_workers``, ``prebuilt_triton_cache``, ``fork_servers_per_slot``, ``reference_server``,
  ``reference_processes``.
  An unfinished RL run may be continued with another ``rl.num_rounds``.
- ``eval``: ``model``, ``eval`` and ``verifier``, except ``eval.generation_batch_size``,
  ``compile_decode``, ``generation_workers`` and the verifier's worker counts.

The data a stage read counts too, by content (see ``extensions.runtime.freshness``). ``prepare`` has
its own check on the ``data`` section (``extensions.data.pipeline.input_fingerprint``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Mapping

NEVER_COUNTS = ("source", "source_reason", "run.root", "run.run_id", "checkpoint",
                "model.device_map", "model.attn_implementation")
_SFT_SECTIONS = ("run.seed", "model", "lora", "sft")
_SFT_IGNORED = ("sft.save_every_steps", "sft.eval_every_steps", "sft.keep_last_checkpoints", "sft.log_every_steps",
                "sft.gradient_checkpointing")
_VERIFIER_SPEED = ("verifier.workers", "verifier.prespawn_workers", "verifier.prebuilt_triton_cache",
                   "verifier.fork_servers_per_slot", "verifier.reference_server",
                   "verifier.reference_processes")
STAGE_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # stage: (sections or keys that count, keys inside them that do not)
    "sft": (_SFT_SECTIONS, _SFT_IGNORED),
    "rl": ((*_SFT_SECTIONS, "rl", "verifier"),
           (*_SFT_IGNORED, "rl.keep_last_rounds", "rl.verify_chunk_size", "rl.overlap_verification",
            "rl.generation_batch_size", "rl.cuda_graphs", "rl.compile_decode", *_VERIFIER_SPEED)),
    "eval": (("model", "eval", "verifier"),
             ("eval.generation_batch_size", "eval.compile_decode", "eval.generation_workers", *_VERIFIER_SPEED)),
}


# Keys a stage may change between its checkpoints and its end: the rounds already done are the same
# whether the run ends after 2 rounds or 4, so a run continues from round-N with more rounds. A
# finished result made with another value still does not count as done.
CONTINUABLE = {"rl": ("rl.num_rounds",)}


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def _under(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def resolved_dict(cfg_or_dict: Any) -> dict[str, Any]:
    """The full resolved config as plain data (what meta.json and eval reports store)."""
    data = dataclasses.asdict(cfg_or_dict) if dataclasses.is_dataclass(cfg_or_dict) else dict(cfg_or_dict)
    return json.loads(json.dumps(data, default=str))  # tuples -> lists, as after a JSON round trip


def stage_view(cfg_or_dict: Any, stage: str, *, continuing: bool = False) -> dict[str, Any]:
    """The dotted keys (and values) of the config that decide ``stage``'s result (``continuing``:
    that decide whether its unfinished checkpoints can be continued)."""
    counts, ignored = STAGE_KEYS[stage]
    if continuing:
        ignored = (*ignored, *CONTINUABLE.get(stage, ()))
    flat = flatten(resolved_dict(cfg_or_dict))
    return {key: value for key, value in sorted(flat.items())
            if _under(key, counts) and not _under(key, ignored) and not _under(key, NEVER_COUNTS)}


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_fingerprint(cfg_or_dict: Any) -> str:
    """Fingerprint of every key except those in ``NEVER_COUNTS``."""
    flat = flatten(resolved_dict(cfg_or_dict))
    return _digest({k: v for k, v in flat.items() if not _under(k, NEVER_COUNTS)})


def stage_fingerprint(cfg_or_dict: Any, stage: str) -> str:
    return _digest(stage_view(cfg_or_dict, stage))


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, old, new) for every key whose value differs; a key only one side has shows as absent."""
    absent = "(absent)"
    return [(key, old.get(key, absent), new.get(key, absent))
            for key in sorted(set(old) | set(new)) if old.get(key, absent) != new.get(key, absent)]
