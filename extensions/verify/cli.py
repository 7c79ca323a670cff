"""``python -m extensions.verify``: judge candidate files against one problem file.

    python -m extensions.verify --problem PROBLEM.py --candidate C1 [--candidate C2 ...] \\
        [--device cpu|cuda] [--timeout SECONDS] [--json] [--config FILE] [--set verifier.KEY=VALUE]

With ``--json`` one JSON object per candidate per line on stdout, in the order given. Exit status
0 when every candidate was judged (whatever the verdicts); 2 when the verifier could not run
(unreadable problem file, bad config, a problem whose reference does not run).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

JSON_KEYS = ("candidate", "correct", "stage", "reward", "error", "flags", "speedup", "isolation",
             "allowed_library_calls", "cached", "error_category", "warnings")


def build_parser() -> argparse.ArgumentParser:
    from ..config import add_config_args

    parser = argparse.ArgumentParser(prog="python -m extensions.verify", description=__doc__.split("\n")[0])
    parser.add_argument("--problem", required=True, help="KernelBench-style problem file (class Model)")
    parser.add_argument("--candidate", action="append", required=True,
                        help="candidate file: Python or a raw model response (repeatable)")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default=None,
                        help="default: verifier.device of the config")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per candidate")
    parser.add_argument("--json", action="store_true", help="one JSON object per candidate per line")
    parser.add_argument("--workers", type=int, default=None, help="parallel worker processes")
    add_config_args(parser)
    return parser


def _read(path: str, what: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def format_table(results) -> str:
    rows = [("candidate", "correct", "stage", "reward", "speedup", "flags", "error")]
    for r in results:
        rows.append((r.candidate, "yes" if r.correct else "no", r.stage, f"{r.reward:.2f}",
                     "-" if r.speedup is None else f"{r.speedup:.2f}x", ",".join(r.flags) or "-",
                     (r.error or "-")[:100]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    from ..config import ConfigError, config_from_args
    from .api import VerifierError, VerifyRequest, verify_batch
    from .result import VerifyResult

    from ..config import parse_flags

    args = parse_flags(build_parser(), argv)
    try:
        cfg = config_from_args(args)
    except ConfigError as exc:
        print(f"verify: config error: {exc}", file=sys.stderr)
        return 2
    config = cfg.verifier
    # Stderr only: stdout carries the verdicts (one JSON object per line with --json).
    why = "" if (args.config or args.smoke) else " (the verifier's checks do not depend on the machine; --config or --smoke picks another)"
    print(f"verify: config {cfg.source}{why}", file=sys.stderr, flush=True)
    if args.timeout is not None:
        config.timeout_s = args.timeout
    if args.workers is not None:
        config.workers = args.workers
    try:
        problem = _read(args.problem, "problem")
    except OSError as exc:
        print(f"verify: cannot read problem file {args.problem}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    requests, unreadable = [], {}
    for i, path in enumerate(args.candidate):
        try:
            requests.append(VerifyRequest(problem, _read(path, "candidate"), label=path))
        except OSError as exc:
            unreadable[i] = VerifyResult(path, error=f"extract: cannot read candidate file: {exc.strerror or exc}")
    try:
        judged = iter(verify_batch(requests, config, device=args.device, progress=not args.json))
    except VerifierError as exc:
        print(f"verify: {exc}", file=sys.stderr)
        return 2
    results = [unreadable[i] if i in unreadable else next(judged) for i in range(len(args.candidate))]
    for warning in sorted({w for r in results for w in r.warnings}):
        print(f"verify: WARNING: {warning}", file=sys.stderr)
    if args.json:
        for result in results:
            data = result.to_dict()
            print(json.dumps({k: data[k] for k in JSON_KEYS}), flush=True)
    else:
        print(format_table(results))
    problem_errors = [r for r in results if r.details.get("problem_error")]
    if problem_errors:
        print(f"verify: the problem could not be prepared: {problem_errors[0].error}", file=sys.stderr)
        return 2
    return 0
