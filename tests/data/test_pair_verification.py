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
    # another timing budget or reward table (pairs are judged with timing off; the synthesizer's
    # verdicts serve the learning-signal run): the cached verdict stands
    timed = dataclasses.replace(verifier, timing_budget_s=1.0, timing_max_cv=0.5,
                                reward_weights=dataclasses.replace(verifier.reward_weights, full=0.5))
    assert verify_pairs([pair], timed, progress=False, cache=cache)[0].cached
    # other checks (fewer input sets): judged again, not taken from the cache
    other = verify_pairs([pair], dataclasses.replace(verifier, multi_input_num_tests=2), progress=False, cache=cache)
    assert not other[0].cached and other[0].correct
    assert len(cache.read_text().splitlines()) == 2


def test_an_unwritable_cache_is_said_once_and_the_verdicts_still_come(capsys):
    pairs = [normalise_row(row) for row in bundled_pairs() if row["uuid"] in ("bundled-add", "bundled-clamp")]
    assert len(pairs) == 2
    verifier = load_config(None, ["verifier.device=cpu", "verifier.multi_input_num_tests=1"]).verifier
    verdicts = verify_pairs(pairs, verifier, progress=False, cache=Path("/sys/kernel-rl-no-cache/verdicts.jsonl"))
    assert all(v.correct and not v.cached for v in verdicts)
    warnings = [line for line in capsys.readouterr().err.splitlines() if "cannot be written" in line]
    assert len(warnings) == 1 and "/sys/kernel-rl-no-cache/verdicts.jsonl" in warnings[0]


def test_the_report_names_the_pairs_that_failed():
    """Two GPU runs of the same 690 pairs rejected 2 and 3: only names tell whether the same pair
    flips between machines."""
    from extensions.data.pair_verification import PairVerdict
    from extensions.data.pipeline import failed_pair_rows

    verdicts = [PairVerdict(True, "full"), PairVerdict(False, "compile", error="tiny: mismatch: " + "x" * 400),
                PairVerdict(False, "static", error=None)]
    rows = failed_pair_rows(["a", "b", "c"], verdicts)
    assert [r["uuid"] for r in rows] == ["b", "c"] and rows[0]["stage"] == "compile"
    assert len(rows[0]["error"]) == 200 and rows[1]["error"] == ""
    assert len(failed_pair_rows(["p"] * 80, [PairVerdict(False, "compile")] * 80)) == 50
