"""One RL round's rollouts: sample, verify, score; every step logged so an interrupted round resumes.

``collect_candidates`` samples ``samples_per_task`` completions per task (with each token's
log-probability under the sampling policy), judges them with a ``VerifyFn`` and returns every
candidate of the round on every rank. A verifier that streams (``verdict_stream``; the project
verifier does) judges each chunk of samples while the next chunk samples. The round's candidate log
receives each sample and each verdict as soon as it exists; a resumed round reuses them, and
submits the logged samples that have no verdict before it samples what is missing. The scoring (verdict -> reward) is a
separate, pure function (``extensions.training.rewards``), so it can change without judging again.

Sampling is seeded per chunk of this rank's task list, whatever was already logged, so a chunk
sampled again after a crash gives the same tokens it gave before.

This is the single-turn round (``rl.max_turns: 1``); multi-turn rounds collect their trajectories in
``turn_rollouts`` with the same ``Candidate``, context and log.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from ..config.sections import PipelineConfig, VerifierConfig
from ..generation.sampling import SamplingParams, SamplingStopped, render_prompt_ids, sample_rollouts
from ..prompting.builder import PromptBuilder
from ..runtime.interrupt import SaveSignal
from ..runtime.paths import RunPaths
from ..verify import VerifyRequest
from ..verify.result import VerifyResult
from .candidates import CandidateLog, sample_record, verdict_record
from .distributed import Dist
from .verdict_stream import Key, ProjectVerifier, VerdictStream, result_dict

if TYPE_CHECKING:  # transformers is heavy to import; the tokenizer comes in ready-made
    from transformers import PreTrainedTokenizerBase

# The verifier's own requests in, one verdict per request out, in order.
VerifyFn = Callable[[list[VerifyRequest]], list[VerifyResult]]


@dataclass
class Candidate:
    task_id: str
    level: int
    sample_index: int
    text: str
    result: Optional[dict] = None  # VerifyResult.to_dict()
    token_ids: list[int] = field(default_factory=list)  # as sampled, ending with EOS when it stopped
    logprobs: list[float] = field(default_factory=list)  # sampling policy's log-prob of each token
    score: Optional[float] = None  # the training reward (reward preset); None: the verifier's reward
    # Multi-turn rounds (rl.max_turns > 1): which turn of trajectory (task_id, sample_index) this
    # answer is, the chat prompt it was sampled from, and the earlier turns left out of that prompt.
    turn: int = 1
    prompt: Optional[list[dict]] = None  # None: the task's first prompt (single-turn rounds)
    turns_dropped: int = 0
    prompt_tokens: Optional[int] = None

    @property
    def reward(self) -> float:
        if self.score is not None:
            return self.score
        return float(self.result.get("reward", 0.0)) if self.result else 0.0

    @property
    def correct(self) -> bool:
        return bool(self.result.get("correct")) if self.result else False

    @property
    def key(self) -> tuple[str, int, int]:
        """(task_id, sample_index, turn): unique within a round."""
        return self.task_id, self.sample_index, self.turn


@dataclass
class RoundContext:
    cfg: PipelineConfig
    paths: RunPaths
    dist: Dist
    tokenizer: PreTrainedTokenizerBase
    verify_fn: VerifyFn
    save_signal: Optional[SaveSignal] = None
    progress: bool = True
    # prompt.mode's builder: RL samples from the prompts SFT trained on and evaluation asks with.
    prompts: PromptBuilder = field(default_factory=PromptBuilder)

    def messages(self, task: dict) -> list[dict[str, str]]:
        return self.prompts.messages(task["code"], task["task_id"])

    def stop_requested(self) -> bool:
        """This process was asked to stop (no collective: asked between decode steps). The ranks
        agree at the next ``check_signal``, which every rank reaches after its chunk."""
        return self.save_signal is not None and self.save_signal.stop_requested()


class StopRequested(Exception):
    """A SaveSignal asked the run to stop; everything known is already on disk."""


def check_signal(ctx: RoundContext, served_by: Optional[Path]) -> None:
    """Serve a pending save request (``served_by`` holds the state); raise StopRequested on a stop."""
    if ctx.save_signal is None or not ctx.dist.any(ctx.save_signal.save_requested()):
        return
    stop = ctx.dist.any(ctx.save_signal.stop_requested())
    ctx.save_signal.acknowledge(served_by)
    if stop:
        raise StopRequested(ctx.save_signal.reason or "stop requested")


def make_verify_fn(verifier_cfg: VerifierConfig, device: Optional[str], *, progress: bool = True) -> VerifyFn:
    """The project verifier as a ``VerifyFn`` that also streams (``ProjectVerifier``)."""
    return ProjectVerifier(verifier_cfg, device, progress=progress)


def task_prompt_ids(ctx: "RoundContext", tasks: Sequence[dict]) -> dict[str, list[int]]:
    """The rendered prompt of each task, as the sampler saw it (the update trains on prompt + sample)."""
    ids = render_prompt_ids(ctx.tokenizer, [ctx.messages(t) for t in tasks])
    return {t["task_id"]: row for t, row in zip(tasks, ids)}


def open_round_log(ctx: RoundContext, round_index: int, tasks: Sequence[dict], policy: str) -> CandidateLog:
    candidate_log = CandidateLog(ctx.paths.rl_candidates_log(round_index))
    rl = ctx.cfg.rl
    # The logged log-probs hold only for the same sampling distribution.
    sampling = {"temperature": rl.temperature, "top_p": rl.top_p, "max_new_tokens": rl.max_new_tokens}
    header = {"type": "round", "round": round_index, "task_ids": [t["task_id"] for t in tasks], "policy": policy,
              "samples_per_task": rl.samples_per_task, "sampling": sampling, "prompt": ctx.prompts.describe()}
    if rl.max_turns > 1:  # what decides the later turns' prompts
        header["turns"] = {"max_turns": rl.max_turns, "max_prompt_tokens": ctx.cfg.prompt.max_prompt_tokens}
    if ctx.dist.is_main:
        existing = candidate_log.read()
        if existing.header is not None and any(existing.header.get(k) != header.get(k) for k in ("task_ids", "policy", "samples_per_task", "sampling", "prompt", "turns")):
            stale = candidate_log.set_aside()
            print(f"[rl] round {round_index}: candidate log belongs to another policy, task list, sampling setting, prompt or turn setting; "
                  f"moved to {stale}", flush=True)
            existing = candidate_log.read()
        if existing.header is None:
            candidate_log.append([header])
    ctx.dist.barrier()
    return candidate_log


def collect_candidates(ctx: RoundContext, model, round_index: int, tasks: Sequence[dict], policy: str) -> tuple[list[Candidate], dict]:
    """Sample and verify every candidate of the round (reusing the log), gathered on all ranks.

    With a verifier that streams (``open_session``) and ``rl.overlap_verification``, each chunk's
    candidates go to one verifier session as soon as the chunk is sampled and logged, so they are
    judged while the next chunk samples; otherwise every candidate is judged after sampling,
    ``rl.verify_chunk_size`` at a time.

    Returns the candidates (sorted by task and sample index) and the phase statistics: seconds
    sampling, verifying (while the verifier had work) and waiting (after sampling, for the last
    verdict), and the tokens sampled in this process run (for tokens/s).
    """
    rl = ctx.cfg.rl
    n = rl.samples_per_task
    candidate_log = open_round_log(ctx, round_index, tasks, policy)
    contents = candidate_log.read()
    if ctx.dist.is_main and (contents.samples or contents.damaged_lines):
        print(f"[rl] round {round_index}: reusing {len(contents.samples)} sampled and {len(contents.verdicts)} judged "
              f"candidates from {candidate_log.path}" + (f"; skipped {contents.damaged_lines} damaged line(s)" if contents.damaged_lines else ""),
              flush=True)
    # A sample without its token ids cannot be trained on exactly: it is sampled again.
    samples = {key: text for key, text in contents.samples.items() if key in contents.sequences}
    sequences = dict(contents.sequences)
    verdicts = {key: v for key, v in contents.verdicts.items() if key in samples}
    mine = ctx.dist.shard(tasks)
    # A resumed round's times and tokens are this process's only: what came from the log is counted
    # apart, so a round that sampled nothing does not read as infinitely fast sampling.
    stats = {"sampling_s": 0.0, "verifying_s": 0.0, "waiting_s": 0.0, "sampled_tokens": 0,
             "samples_reused": len(samples), "verdicts_reused": len(verdicts)}

    tasks_per_chunk = max(1, rl.generation_batch_size // n)
    chunks = [mine[start:start + tasks_per_chunk] for start in range(0, len(mine), tasks_per_chunk)]
    to_sample = [index for index, chunk in enumerate(chunks)
                 if not all((t["task_id"], i) in samples for t in chunk for i in range(n))]
    code_of = {t["task_id"]: t["code"] for t in tasks}

    def unjudged(chunk_tasks: Sequence[dict]) -> list[Key]:
        return [(t["task_id"], i) for t in chunk_tasks for i in range(n)
                if (t["task_id"], i) not in verdicts and (t["task_id"], i) in samples]

    def request(key: Key) -> VerifyRequest:
        tid, i = key
        return VerifyRequest(problem_code=code_of[tid], candidate_text=samples[key], label=f"r{round_index}/{tid}/{i}")

    def sample_chunks(after_chunk: Optional[Callable[[list[dict]], None]] = None,
                      while_sampling: Callable[[], Any] = contextlib.nullcontext) -> None:
        """Sample the chunks not (wholly) in the log, each logged as soon as it is sampled; a
        chunk's samples then go to ``after_chunk`` (unless this process is stopping). Each chunk
        is decoded inside ``while_sampling()`` (the verifier times no kernel meanwhile). Every chunk
        of the largest share is followed by a signal check, sampled here or not, so each rank
        makes as many checks (each one a collective) whatever the log held of its share."""
        started = time.perf_counter()
        largest_share = -(-len(tasks) // ctx.dist.world_size)
        for chunk_index in range(-(-largest_share // tasks_per_chunk)):
            if chunk_index not in to_sample:
                check_signal(ctx, candidate_log.path)
                continue
            chunk = chunks[chunk_index]
            params = SamplingParams(
                max_new_tokens=rl.max_new_tokens, temperature=rl.temperature, top_p=rl.top_p,
                seed=ctx.cfg.run.seed + 100_003 * round_index + 1009 * ctx.dist.rank + chunk_index,
                batch_size=rl.generation_batch_size, cuda_graphs=rl.cuda_graphs, compile_step=rl.compile_decode,
            )
            try:
                with while_sampling():
                    _, rollouts = sample_rollouts(model, ctx.tokenizer, [ctx.messages(t) for t in chunk], n, params,
                                                  progress=ctx.progress, should_stop=ctx.stop_requested)
            except SamplingStopped as stopped:
                # A Ctrl-C between decode steps: keep what finished, then stop through the signal check.
                rollouts = stopped.partial
            records = []
            for task, task_rollouts in zip(chunk, rollouts):
                for i, rollout in enumerate(task_rollouts):
                    if rollout is None:
                        continue
                    text, sequence = rollout
                    key = (task["task_id"], i)
                    if samples.get(key) != text:  # a verdict judges one text only
                        verdicts.pop(key, None)
                    samples[key] = text
                    sequences[key] = (sequence.token_ids, [float(x) for x in sequence.logprobs])
                    stats["sampled_tokens"] += len(sequence.token_ids)
                    records.append(sample_record(task["task_id"], i, text, sequence.token_ids, sequence.logprobs))
            candidate_log.append(records)
            if after_chunk is not None and not ctx.stop_requested():
                after_chunk(chunk)
            check_signal(ctx, candidate_log.path)
        stats["sampling_s"] = time.perf_counter() - started

    # The path depends on the verifier and the config only, the same on every rank, so every rank
    # makes as many signal checks even where one has nothing left to judge.
    if rl.overlap_verification and callable(getattr(ctx.verify_fn, "open_session", None)):
        expected = sum(1 for t in mine for i in range(n) if (t["task_id"], i) not in verdicts)
        stream = VerdictStream(ctx.verify_fn, candidate_log, expected)
        logged_chunks = [chunk for index, chunk in enumerate(chunks) if index not in to_sample]
        verdicts.update(_sample_while_verifying(ctx, stream, stats, sample_chunks, unjudged, request, logged_chunks))
    else:
        sample_chunks()
        # Verification, a chunk at a time, each verdict logged as soon as its chunk is judged.
        pending = unjudged(mine)
        started = time.perf_counter()
        chunk_size = max(1, rl.verify_chunk_size)
        for start in range(0, len(pending), chunk_size):
            chunk = pending[start:start + chunk_size]
            results = ctx.verify_fn([request(key) for key in chunk])
            if len(results) != len(chunk):
                raise RuntimeError(f"verifier returned {len(results)} results for {len(chunk)} candidates")
            records = []
            for key, result in zip(chunk, results):
                verdicts[key] = result_dict(result)
                records.append(verdict_record(key[0], key[1], samples[key], verdicts[key]))
            candidate_log.append(records)
            check_signal(ctx, candidate_log.path)
        stats["verifying_s"] = stats["waiting_s"] = time.perf_counter() - started

    level_of = {t["task_id"]: int(t["level"]) for t in tasks}
    local = [dataclasses.asdict(Candidate(tid, level_of[tid], i, samples[(tid, i)], verdicts[(tid, i)],
                                          list(sequences[(tid, i)][0]), list(sequences[(tid, i)][1])))
             for t in mine for tid in [t["task_id"]] for i in range(n)]
    gathered = [Candidate(**c) for c in ctx.dist.gather_objects(local)]
    gathered.sort(key=lambda c: (c.task_id, c.sample_index))
    stats["sampled_tokens"] = int(ctx.dist.sum([float(stats["sampled_tokens"])])[0])
    return gathered, stats


def _sample_while_verifying(ctx: RoundContext, stream: VerdictStream, stats: dict, sample_chunks, unjudged,
                            request, logged_chunks: list[list[dict]]) -> dict[Key, dict]:
    """The overlapped round: the logged samples still unjudged go to ``stream`` first, then each
    chunk as it is sampled; the verdicts are logged as they arrive and returned once all are in.

    A stop (Ctrl-C, SIGTERM, a spot notice) while sampling stops the decode as before; while
    waiting for verdicts it ends the wait at once. Either way the session is stopped: what waits
    is cancelled, what runs is killed, and the verdicts logged so far stay. A save request without
    a stop is served at the check after the wait, one check on every rank whatever its candidates.
    """
    def submit(chunk_tasks: Sequence[dict]) -> None:
        stream.check()  # the verifier failed (no sandbox, say): say so now, not after sampling
        keys = unjudged(chunk_tasks)
        stream.submit([(key, item.candidate_text, item) for key, item in zip(keys, map(request, keys))])

    complete = False
    try:
        for chunk in logged_chunks:
            submit(chunk)
        # The sampler's decode and the verifier's correctness runs share the GPU; a timing run
        # waits for the chunk being decoded, so a kernel is never timed beside the sampler.
        sample_chunks(submit, stream.gpu_in_use)
        sampled = time.perf_counter()
        complete = stream.wait(ctx.stop_requested)
        stats["waiting_s"] = time.perf_counter() - sampled
    finally:
        stream.close(stop=not complete)
    stats["verifying_s"] = stream.busy_s
    check_signal(ctx, stream.log.path)
    if not complete:  # the stop that ended the wait was served meanwhile: stop all the same
        raise StopRequested(ctx.save_signal.reason if ctx.save_signal and ctx.save_signal.reason else "stop requested")
    return stream.verdicts
