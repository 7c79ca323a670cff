"""The data stage's verdict cache: a pair is judged once per verifier, device and set of checks."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from extensions.config import load_config
from extensions.data.bundled import bundled_pairs
from extensions.data.kernelbook import normalise_row
from extensions.data.pair_verification import verify_pairs


def test_cached_verdicts_are_reused_only_under_the_same_checks(tmp_path):
    pair = normalise_row(next(row for row in bundled_pairs() if row["uuid"] == "bundled-add"))
    cache = tmp_path / "verdicts.jsonl"
    verifier = load_config(None, ["verifier.device=cpu"]).verifier
    first = verify_pairs([pair], verifier, progress=False, cache=cache)
    assert first[0].correct and not first[0].cached
    # other scheduling, same checks: the cached verdict stands
    again = verify_pairs([pair], dataclasses.replace(verifier, workers=1), progress=False, cache=cache)
    assert again[0].cached and again[0].correct
    # other checks (fewer input sets): judged again, not taken from the cache
    other = verify_pairs([pair], dataclasses.replace(verifier, multi_input_num_tests=2), progress=False, cache=cache)
    assert not other[0].cached and other[0].correct
    assert len(cache.read_text().splitlines()) == 2


def test_an_unwritable_cache_is_said_once_and_the_verdicts_still_come(capsys):
    pair = normalise_row(next(row for row in bundled_pairs() if row["uuid"] == "bundled-add"))
    verifier = load_config(None, ["verifier.device=cpu", "verifier.multi_input_num_tests=1"]).verifier
    verdicts = verify_pairs([pair], verifier, progress=False, cache=Path("/sys/kernel-rl-no-cache/verdicts.jsonl"))
    assert verdicts[0].correct and not verdicts[0].cached
    warnings = [line for line in capsys.readouterr().err.splitlines() if "cannot be written" in line]
    assert len(warnings) == 1 and "/sys/kernel-rl-no-cache/verdicts.jsonl" in warnings[0]
