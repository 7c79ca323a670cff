"""The synthesizer: programs -> inductor on the GPU -> canonical pairs -> verified -> KernelBook JSONL.

KernelBook was made by running torch inductor over PyTorch modules; this does the same on the
user's GPU, for programs drawn by ``programs.draw_programs`` and for module files the user names.
Every program is decontaminated against the evaluation tasks (the data stage's text similarity and
thresholds, and its traced-computation rule: a program that computes what a task computes is
dropped as ``same_computation_as_eval_problem``) and de-duplicated against the programs before it
before it is compiled;
every captured pair is canonicalised and verified on CUDA by the project's verifier (correctness
on every input set; timing off, since a pair is training data, not a reward). Screening,
capturing and verifying overlap: captures run in worker processes from the first program screened,
and each captured pair goes to one verifier session as soon as it exists.

Resumable: ``<out>`` holds the verified rows, ``<out stem>.dropped.jsonl`` every program that was
not kept and why, ``<out stem>.captured.jsonl`` every captured row (before verification); a rerun
skips every program named in the first two and verifies captured rows without compiling them again
(verification, not compilation, is the slow half on one GPU). ``<out stem>.report.json`` counts
what was tried, built and dropped, by reason.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter, deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

from ...runtime.io import atomic_write_json, read_jsonl
from ..dedup import SimilarityIndex, code_shingles
from ..operator_graph import ComputationIndex, SignatureTracer
from .programs import FAMILIES, Program, draw_programs


@dataclass
class SynthesisOptions:
    out: Path  # the verified pairs, KernelBook-format JSONL
    count: int = 3000  # programs drawn (the file's programs are added to them)
    seed: int = 0
    families: tuple[str, ...] = FAMILIES
    module_files: list[Path] = field(default_factory=list)  # the user's own KernelBench-form modules
    eval_tasks: list[Path] = field(default_factory=list)  # KernelBench-style JSONL to decontaminate against
    decontamination_threshold: float = 0.85  # the data stage's defaults (DataConfig)
    near_duplicate_threshold: float = 0.9
    decontaminate_by_computation: bool = True  # also drop programs whose traced graph equals a task's
    capture_workers: int = 0  # 0: half the CPU cores, at most 12
    verify_workers: int = 0  # verifier slots; 0: the verifier's own default
    max_minutes: float = 0.0  # stop starting new work after this long (0: no limit); rerun resumes
    # Programs in capture or captured and awaiting a verdict, at most (0: the verifier's lookahead
    # plus two per capture worker). Capturing far ahead of verification spends the CPU that the
    # verifier, the bottleneck, needs; what is not captured before a deadline is drawn next run.
    capture_ahead: int = 0
    verify_device: str = "cuda"  # where captured pairs are judged (cpu: the interpreter, for tests)
    # Program -> Captured, run in the capture processes (a module-level function); None: inductor
    # on the CUDA device (``capture.capture``). Tests put recorded captures here.
    capture: Optional[Callable[[Program], Any]] = None
    progress: bool = True


@dataclass
class SynthesisReport:
    programs: int = 0
    already_done: int = 0
    tried: int = 0
    captured: int = 0
    pairs_built: int = 0
    dropped: Counter = field(default_factory=Counter)
    by_family: dict[str, Counter] = field(default_factory=dict)
    seconds: float = 0.0
    capture_seconds: float = 0.0  # summed over capture workers
    verify_seconds: float = 0.0  # wall time of the verifier's batches
    stopped_early: bool = False
    untraceable: int = 0  # programs whose computation could not be traced (the text rule alone judged them)
    most_unjudged: int = 0  # the most captured rows awaiting a verdict at once

    def count(self, family: str, outcome: str) -> None:
        """One program's outcome: kept, or the reason it was dropped."""
        if outcome != "kept":
            self.dropped[outcome] += 1
        self.by_family.setdefault(family, Counter())[outcome] += 1

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["dropped"] = dict(self.dropped.most_common())
        data["by_family"] = {k: dict(v) for k, v in sorted(self.by_family.items())}
        minutes = max(self.seconds / 60.0, 1e-9)
        data["pairs_per_minute"] = round(self.pairs_built / minutes, 1)
        return data


def dropped_path(out: Path) -> Path:
    return out.with_name(out.stem + ".dropped.jsonl")


def captured_path(out: Path) -> Path:
    return out.with_name(out.stem + ".captured.jsonl")


def _captured_rows(out: Path, done: set[str]) -> dict[str, dict]:
    rows = {}
    if captured_path(out).is_file():
        for _, row in read_jsonl(captured_path(out), errors="strict"):
            if row.get("sha") and row["sha"] not in done:
                rows[row["sha"]] = row
    return rows


def report_path(out: Path) -> Path:
    return out.with_name(out.stem + ".report.json")


def user_programs(paths: Iterable[Path]) -> list[Program]:
    programs = []
    for path in paths:
        source = Path(path).read_text(encoding="utf-8")
        templates = any(word in source for word in ("nn.Linear", "nn.Conv", "matmul", "bmm", "F.linear", "F.conv"))
        programs.append(Program(f"user_{Path(path).stem}", "user", source, templates))
    return programs


def _kept_rows(out: Path) -> list[dict]:
    """The pairs already in ``out`` (a line cut by a dying machine is skipped: its program runs again)."""
    return [row for _, row in read_jsonl(out, errors="strict")] if out.is_file() else []


def _done_digests(out: Path, kept: list[dict]) -> set[str]:
    """Programs judged by earlier runs: the pairs ``kept`` in ``out`` and those dropped beside it."""
    dropped = [row for _, row in read_jsonl(dropped_path(out), errors="strict")] if dropped_path(out).is_file() else []
    return {digest for row in kept + dropped if (digest := row.get("sha") or row.get("digest"))}


def _eval_rows(paths: Iterable[Path]) -> dict[str, str]:
    """Evaluation task code by key (``<level>_<name>``)."""
    rows = {}
    for path in paths:
        for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines()):
            try:
                row = json.loads(line)
                rows[f"{row.get('level', '?')}_{row.get('name', number)}"] = row["code"]
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    return rows


def _eval_index(paths: Iterable[Path]) -> SimilarityIndex:
    index = SimilarityIndex()
    for key, code in _eval_rows(paths).items():
        try:
            index.add(key, code_shingles(code))
        except (SyntaxError, ValueError):
            continue
    return index


class _Appender:
    """Appends JSON lines and makes them durable before the next batch (a spot instance may die)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(path, "a", encoding="utf-8")

    def write(self, rows: Iterable[dict]) -> None:
        for row in rows:
            self.handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        self.handle.flush()
        os.fsync(self.handle.fileno())

    def close(self) -> None:
        self.handle.close()


def _dropped_row(program: Program, reason: str, detail: str = "") -> dict[str, str]:
    return {"digest": program.digest, "name": program.name, "reason": reason, "detail": detail}


def _capture_in_worker(program: Program, capture_fn: Optional[Callable[[Program], Any]] = None) -> dict[str, Any]:
    if capture_fn is None:
        from .capture import capture as capture_fn

    result = capture_fn(program)
    return {"ok": result.ok, "reason": result.reason, "detail": result.detail, "row": result.row,
            "seconds": result.seconds}


def _init_worker() -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


def _kept_sources(kept: list[dict]) -> dict[str, str]:
    """Program source by digest of the pairs ``kept`` by earlier runs: a later run, with another
    seed, must not keep near-copies of them."""
    return {row["sha"]: row["python_code"] for row in kept
            if row.get("sha") and isinstance(row.get("python_code"), str)}


def screen_programs(programs: list[Program], options: SynthesisOptions, report: SynthesisReport,
                    dropped: _Appender, already_kept: Optional[dict[str, str]] = None) -> Iterator[Program]:
    """Decontaminate and de-duplicate, in order, yielding each program kept as soon as it is judged
    (the GPU starts on the first while the rest are screened); what is dropped is written and counted.
    ``already_kept`` (source by digest) are pairs of earlier runs: near-copies of them are dropped too."""
    eval_index = _eval_index(options.eval_tasks)
    by_computation = options.decontaminate_by_computation and len(eval_index) > 0
    kept_index = SimilarityIndex()
    for digest, source in (already_kept or {}).items():
        kept_index.add(digest, code_shingles(source))
    with SignatureTracer() as tracer:
        computations = ComputationIndex()
        if by_computation:
            for key, code in _eval_rows(options.eval_tasks).items():
                computations.add(key, tracer.signature(code))
        for program in programs:
            shingles = code_shingles(program.source)
            match = eval_index.most_similar(shingles, options.decontamination_threshold)
            reason, detail = ("overlaps_eval_problem", f"{match[0]} ({match[1]:.2f})") if match else ("", "")
            if not reason:  # the cheap text rule first: tracing is the slow half of screening
                near = kept_index.most_similar(shingles, options.near_duplicate_threshold)
                reason, detail = ("near_duplicate", f"{near[0]} ({near[1]:.2f})") if near else ("", "")
            if not reason and by_computation:
                signature = tracer.signature(program.source)
                report.untraceable += not signature.traceable
                same = computations.match(signature)
                if same:
                    reason = "same_computation_as_eval_problem"
                    detail = f"{same.key} ({'exact graph' if same.exact else 'same computation'})"
            if reason:
                report.count(program.family, reason)
                dropped.write([_dropped_row(program, reason, detail)])
                continue
            kept_index.add(program.digest, shingles)
            yield program


def synthesize(options: SynthesisOptions) -> SynthesisReport:
    started = time.time()
    report = SynthesisReport()
    programs = draw_programs(options.count, options.seed, options.families) + user_programs(options.module_files)
    report.programs = len(programs)
    kept_before = _kept_rows(options.out)
    done = _done_digests(options.out, kept_before)
    todo = [p for p in programs if p.digest not in done]
    report.already_done = len(programs) - len(todo)
    previous_runs = _previous_runs(options.out)
    waiting = _captured_rows(options.out, done)  # captured by an earlier run, not yet verified
    kept_out, dropped_out = _Appender(options.out), _Appender(dropped_path(options.out))
    captured_out = _Appender(captured_path(options.out))
    by_digest = {p.digest: p for p in todo}

    def write_report() -> None:
        _write_report(options.out, report, started, previous_runs)

    try:
        screened = screen_programs([p for p in todo if p.digest not in waiting], options, report, dropped_out,
                                   _kept_sources(kept_before))
        deadline = started + options.max_minutes * 60 if options.max_minutes > 0 else None
        outputs = _Outputs(kept_out, dropped_out, captured_out, write_report)
        _run(screened, [row for sha, row in waiting.items() if sha in by_digest], options, report, outputs, by_digest,
             deadline)
    finally:
        for handle in (kept_out, dropped_out, captured_out):
            handle.close()
        write_report()
    return report


def _previous_runs(out: Path) -> list[dict]:
    try:
        return json.loads(report_path(out).read_text()).get("runs", []) if report_path(out).is_file() else []
    except (json.JSONDecodeError, OSError):
        return []


def _write_report(out: Path, report: SynthesisReport, started: float, previous_runs: list[dict]) -> None:
    """The report, rewritten after every verified batch: a machine that dies keeps its counts."""
    report.seconds = round(time.time() - started, 1)
    summary = report.to_dict()
    summary["pairs_in_file"] = sum(1 for _ in open(out, encoding="utf-8")) if out.is_file() else 0
    summary["runs"] = previous_runs + [{k: summary[k] for k in (
        "tried", "captured", "pairs_built", "seconds", "capture_seconds", "verify_seconds", "pairs_per_minute",
        "stopped_early")}]
    atomic_write_json(report_path(out), summary, sort_keys=False, default=None)


@dataclass
class _Outputs:
    kept: _Appender
    dropped: _Appender
    captured: _Appender
    write_report: Callable[[], None]


def _run(todo: Iterator[Program], waiting: list[dict], options: SynthesisOptions, report: SynthesisReport,
         outputs: _Outputs, by_digest: dict[str, Program], deadline: Optional[float]) -> None:
    """Captures in worker processes; each captured row goes to one verifier session as soon as it
    exists (rows captured by an earlier run first), a few slots' worth ahead at most, so the
    verifier never waits for a batch to fill and never builds references far ahead of its slots."""
    from ...config import VerifierConfig
    from ..kernelbook import normalise_row
    from ..pair_verification import PairVerification

    workers = options.capture_workers or max(1, min(8, (os.cpu_count() or 2) // 2))
    lock = threading.Lock()
    queued: "deque[dict]" = deque(waiting)  # captured, not yet handed to the verifier
    in_flight = [0]
    stopping = threading.Event()  # past the deadline: verdicts no longer counted, rows stay captured
    bar = None
    if options.progress:
        from tqdm.auto import tqdm

        bar = tqdm(desc="synthesize", unit="program", mininterval=1.0)

    def drop(program: Program, reason: str, detail: str = "") -> None:
        report.count(program.family, reason)
        outputs.dropped.write([_dropped_row(program, reason, detail)])

    config = VerifierConfig(device=options.verify_device, workers=options.verify_workers)
    verification = PairVerification(config, expected=len(by_digest))
    ahead = max(8, 3 * verification.slots())
    capture_ahead = options.capture_ahead or ahead + 2 * workers
    verify_started = time.time()

    def room_to_capture(pending: int) -> bool:
        with lock:
            return pending + len(queued) + in_flight[0] < capture_ahead

    last_report = [0.0]

    def record(row: dict, future) -> None:
        with lock:
            in_flight[0] -= 1
            if stopping.is_set() or future.cancelled():
                return
            program = by_digest[row["sha"]]
            error = future.exception()
            if error is not None:  # the verifier itself failed: the row stays captured for a rerun
                report.stopped_early = True
                stopping.set()
                print(f"synthesis: verifier failed: {error}", file=sys.stderr)
                return
            verdict = future.result()
            if verdict.correct:
                row["verified"] = {"device": verdict.device, "stage": verdict.stage, "isolation": verdict.isolation}
                outputs.kept.write([row])
                report.pairs_built += 1
                report.count(program.family, "kept")
            else:
                drop(program, f"verify_{verdict.stage}", (verdict.error or "")[:200])
            if time.time() - last_report[0] > 10:  # the report counts the file's lines: not per verdict
                last_report[0] = time.time()
                report.verify_seconds = time.time() - verify_started
                outputs.write_report()

    def on_verdict(row: dict):
        def finished(future) -> None:
            record(row, future)
            feed()

        return finished

    def feed() -> None:
        """Hand queued rows to the verifier while fewer than ``ahead`` are waiting or running."""
        while True:
            with lock:
                if stopping.is_set() or not queued or in_flight[0] >= ahead:
                    return
                row = queued.popleft()
                in_flight[0] += 1
            future = verification.submit_many([normalise_row(row)])[0]
            if future.done():  # a cached verdict: recorded here, not by a callback that feeds again
                record(row, future)
            else:
                future.add_done_callback(on_verdict(row))

    try:
        feed()
        pending: dict[Future, Program] = {}
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"),
                                 initializer=_init_worker) as pool:
            exhausted = False
            while not exhausted or pending:
                if deadline is not None and time.time() > deadline:
                    report.stopped_early = True  # what has not started runs in the next call
                    exhausted = True
                    for future in list(pending):
                        if future.cancel():
                            pending.pop(future)
                while (not exhausted and len(pending) < 2 * workers and not stopping.is_set()
                       and room_to_capture(len(pending))):
                    program = next(todo, None)
                    if program is None:
                        exhausted = True
                    else:
                        pending[pool.submit(_capture_in_worker, program, options.capture)] = program
                if not pending:
                    if exhausted or stopping.is_set():
                        break
                    time.sleep(0.2)  # the verifier is behind: capture again once it catches up
                    feed()
                    continue
                finished, _ = wait(list(pending), timeout=5.0, return_when=FIRST_COMPLETED)
                for future in finished:
                    program = pending.pop(future)
                    report.tried += 1
                    if bar is not None:
                        bar.update(1)
                    try:
                        outcome = future.result()
                    except Exception as exc:  # noqa: BLE001 - a dead worker loses one program, not the run
                        with lock:
                            drop(program, "capture_crashed", type(exc).__name__)
                        continue
                    report.capture_seconds += outcome["seconds"]
                    if outcome["ok"]:
                        report.captured += 1
                        outputs.captured.write([outcome["row"]])
                        with lock:
                            queued.append(outcome["row"])
                            report.most_unjudged = max(report.most_unjudged, len(queued) + in_flight[0])
                    else:
                        with lock:
                            drop(program, outcome["reason"], outcome["detail"])
                feed()
        # Every program is captured: wait for the verdicts, or stop at the deadline.
        while True:
            feed()
            with lock:
                if in_flight[0] == 0 and (not queued or stopping.is_set()):
                    break
            if deadline is not None and time.time() > deadline:
                report.stopped_early = True
                break
            time.sleep(0.5)
    finally:
        # Past the deadline what waits is cancelled and what runs is stopped; their rows stay in
        # captured.jsonl and are verified by the next run.
        stop = report.stopped_early or stopping.is_set() or in_flight[0] > 0
        with lock:
            if stop:
                stopping.set()
        verification.close(stop=stop)
        report.verify_seconds = time.time() - verify_started
        if bar is not None:
            bar.close()


def format_report(report: SynthesisReport) -> str:
    data = report.to_dict()
    lines = [f"capture {data['capture_seconds'] / 60:.1f} worker-min, verify {data['verify_seconds'] / 60:.1f} min", f"programs {data['programs']} (already done {data['already_done']}), tried {data['tried']}, "
             f"captured {data['captured']}, pairs built {data['pairs_built']} in {data['seconds'] / 60:.1f} min "
             f"({data['pairs_per_minute']} pairs/min)" + (" - stopped at --max-minutes" if data["stopped_early"] else "")]
    if data["dropped"]:
        lines.append("dropped: " + ", ".join(f"{reason}={n}" for reason, n in data["dropped"].items()))
    for family, counts in data["by_family"].items():
        lines.append(f"  {family:<12} " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return "\n".join(lines)
