"""Multi-turn RL rounds (rl.max_turns > 1): discounted returns and the advantages they feed, whole
dialogues as Best-of-N targets, and rounds on the tiny model that refine on feedback with every
turn logged and counted (the resume after a kill: ``test_rl_multiturn_resume``)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kill_support import json_records

from extensions.runtime.paths import RunPaths
from extensions.training.objectives.best_of_n import final_turns, select_top_k, tokenize_dialogue
from extensions.training.objectives.policy_gradient import TokenObjective
from extensions.training.rollouts import Candidate
from extensions.training.turn_rollouts import with_discounted_returns
from extensions.verify.result import VerifyResult
from project_paths import PROJECT_ROOT


def _turn(task: str, sample: int, turn: int, score: float) -> Candidate:
    return Candidate(task, 1, sample, f"{task}-{sample}-{turn}", {"reward": score, "correct": score == 1.0,
                                                                   "stage": "full" if score == 1.0 else "compile"},
                     score=score, turn=turn, prompt=[{"role": "user", "content": task}])


# Three trajectories: a#0 fixed in turn 3, a#1 never fixed, b#0 right at once (listed out of order).
TURNS = [_turn("a", 0, 3, 1.0), _turn("a", 0, 1, 0.3), _turn("a", 1, 1, 0.0), _turn("a", 0, 2, 0.3),
         _turn("b", 0, 1, 1.0), _turn("a", 1, 2, 0.5)]


def test_each_turn_trains_on_its_discounted_return():
    returns = {c.key: c.reward for c in with_discounted_returns(TURNS, gamma=0.4)}
    assert returns == pytest.approx({
        ("a", 0, 1): 0.3 + 0.4 * 0.3 + 0.16 * 1.0,  # 0.58
        ("a", 0, 2): 0.3 + 0.4 * 1.0,               # 0.7
        ("a", 0, 3): 1.0,
        ("a", 1, 1): 0.0 + 0.4 * 0.5,               # 0.2
        ("a", 1, 2): 0.5,
        ("b", 0, 1): 1.0,
    })
    assert [c.reward for c in with_discounted_returns(TURNS, gamma=0.0)] == [c.reward for c in TURNS]
    with pytest.raises(ValueError, match="a#0 has turns \\[1, 3\\]"):
        with_discounted_returns([TURNS[0], TURNS[1]], gamma=0.4)


# deviations from 0.596: -0.016, 0.104, 0.404, -0.396, -0.096; sample std over 5 - 1
GROUP_A_STD = ((0.016**2 + 0.104**2 + 0.404**2 + 0.396**2 + 0.096**2) / 4) ** 0.5


@pytest.mark.parametrize("algorithm, expected", [
    # group a: returns 0.58, 0.7, 1.0 (a#0) and 0.2, 0.5 (a#1); mean 0.596; b alone: no spread.
    ("rloo", {("a", 0, 1): 0.58 - (0.7 + 1.0 + 0.2 + 0.5) / 4, ("a", 0, 2): 0.7 - (0.58 + 1.0 + 0.2 + 0.5) / 4,
              ("a", 0, 3): 1.0 - (0.58 + 0.7 + 0.2 + 0.5) / 4, ("a", 1, 1): 0.2 - (0.58 + 0.7 + 1.0 + 0.5) / 4,
              ("a", 1, 2): 0.5 - (0.58 + 0.7 + 1.0 + 0.2) / 4, ("b", 0, 1): 0.0}),
    ("reward_weighted", {("a", 0, 1): 0.58 / (3.98 / 6), ("a", 0, 2): 0.7 / (3.98 / 6), ("a", 0, 3): 1.0 / (3.98 / 6),
                         ("a", 1, 1): 0.2 / (3.98 / 6), ("a", 1, 2): 0.5 / (3.98 / 6), ("b", 0, 1): 1.0 / (3.98 / 6)}),
    ("grpo", {key: (value - 0.596) / (GROUP_A_STD + 1e-4) for key, value in {
        ("a", 0, 1): 0.58, ("a", 0, 2): 0.7, ("a", 0, 3): 1.0, ("a", 1, 1): 0.2, ("a", 1, 2): 0.5}.items()}
     | {("b", 0, 1): 0.0}),
])
def test_policy_gradient_advantages_take_the_turn_returns(algorithm, expected):
    """Every turn is a sample of its task's group, and its reward is its return."""
    from extensions.config import PipelineConfig
    from extensions.training.objectives import make_objective

    cfg = PipelineConfig()
    cfg.rl.algorithm, cfg.rl.samples_per_task = algorithm, 2
    objective = make_objective(cfg)
    assert isinstance(objective, TokenObjective)
    candidates = with_discounted_returns(TURNS, gamma=0.4)
    weights = dict(zip((c.key for c in candidates), objective.sample_weights(candidates)))
    assert weights == pytest.approx(expected, rel=1e-4)


def test_best_of_n_keeps_final_kernels_and_trains_on_own_turns_only():
    from extensions.prompting.templates import build_messages
    from extensions.models.tiny import build_tiny_tokenizer

    finals = final_turns(TURNS)
    assert [c.key for c in finals] == [("a", 0, 3), ("a", 1, 2), ("b", 0, 1)]
    assert [c.key for c in select_top_k(finals, top_k=1, threshold=0.3)] == [("a", 0, 3), ("b", 0, 1)]

    tokenizer = build_tiny_tokenizer()
    task = build_messages("class Model: pass")  # holds a worked example: an assistant turn not of the model's own
    dialogue = [*task, {"role": "assistant", "content": "first try"},
                {"role": "user", "content": "Verifier result: compile error"},
                {"role": "assistant", "content": "second try"}]
    example = tokenize_dialogue(tokenizer, dialogue, own_from=len(task))
    whole = tokenizer.apply_chat_template(dialogue, tokenize=False)
    assert tokenizer.decode(example.input_ids) == whole
    trained = [token for token, label in zip(example.input_ids, example.labels) if label != -100]
    assert tokenizer.decode(trained) == "first try<|im_end|>\nsecond try<|im_end|>\n"
    # One answer after the task: exactly the single-turn example SFT and Best-of-N have always used.
    from extensions.training.batching import tokenize_example

    single = tokenize_example(tokenizer, task, "only try")
    assert tokenize_dialogue(tokenizer, [*task, {"role": "assistant", "content": "only try"}], len(task)) == single


def test_an_answer_cut_off_by_the_token_limit_is_trained_without_an_end_of_turn():
    # Labelling an end of turn where sampling merely ran out of tokens teaches the model to stop
    # there; Best-of-N answers then shrink round by round.
    from extensions.prompting.templates import build_messages
    from extensions.training.objectives.base import RoundRollouts
    from extensions.training.objectives.best_of_n import tokenize_kept
    from extensions.models.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    eos = [tokenizer.eos_token_id]
    task = build_messages("class Model: pass")
    dialogue = [*task, {"role": "assistant", "content": "first try"},
                {"role": "user", "content": "Verifier result: compile error"},
                {"role": "assistant", "content": "second tr"}]
    cut = tokenize_dialogue(tokenizer, dialogue, own_from=len(task), last_finished=False)
    trained = [token for token, label in zip(cut.input_ids, cut.labels) if label != -100]
    assert tokenizer.decode(trained) == "first try<|im_end|>\nsecond tr"

    prompt_ids = tokenizer(tokenizer.apply_chat_template(task, tokenize=False, add_generation_prompt=True),
                           add_special_tokens=False)["input_ids"]
    answer = tokenizer("relu_kernel", add_special_tokens=False)["input_ids"]
    rollouts = RoundRollouts(0, [{"task_id": "t"}], [], {"t": prompt_ids}, {"t": task})
    stopped = Candidate("t", 1, 0, "relu_kernel", {"reward": 1.0}, token_ids=[*answer, *eos], score=1.0)
    truncated = Candidate("t", 1, 1, "relu_kernel", {"reward": 1.0}, token_ids=answer, score=1.0)
    (ended, open_), report = tokenize_kept(tokenizer, [stopped, truncated], rollouts, eos, max_seq_len=4096)
    assert report.kept == 2
    for example, labelled in ((ended, [*answer, *eos]), (open_, answer)):
        assert example.input_ids == [*prompt_ids, *labelled]
        assert [label for label in example.labels if label != -100] == labelled


@pytest.mark.parametrize("key, value, message", [("max_turns", 0, "rl.max_turns must be >= 1, got 0"),
                                                 ("gamma", 1.5, "rl.gamma must be in \\[0, 1\\], got 1.5")])
def test_unusable_turn_settings_are_refused_by_name(key, value, message):
    from extensions.config import PipelineConfig
    from extensions.training.objectives import make_objective

    cfg = PipelineConfig()
    setattr(cfg.rl, key, value)
    with pytest.raises(ValueError, match=message):
        make_objective(cfg)


# -- whole rounds on the tiny model ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from extensions.models.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny_model"))


class ScriptedVerifier:
    """Sample 0 of every task is fixed in turn 2; every other answer fails with a numerical mismatch.
    Records what it judged."""

    def __init__(self):
        self.labels: list[str] = []

    def __call__(self, items):
        results = []
        for request in items:
            label = request.label
            self.labels.append(label)
            if label.endswith("/0/turn2"):
                results.append(VerifyResult(candidate=label, correct=True, stage="full", reward=1.0))
            else:
                results.append(VerifyResult(candidate=label, stage="tiny", reward=0.2, error="full: values differ",
                                            error_category="numerical_mismatch", details={"mismatch": "values"}))
        return results


def _config(root: Path, model_dir: Path, extra=()):
    from extensions.config import load_config
    from extensions.models.tiny import tiny_rl_tasks

    cfg = load_config(PROJECT_ROOT / "configs" / "smoke.yaml", [
        f"run.root={root}", f"model.name_or_path={model_dir}", "model.gguf_file=null", "model.dtype=float32",
        "rl.num_rounds=1", "rl.tasks_per_round=2", "rl.samples_per_task=3", "rl.max_new_tokens=6",
        "rl.generation_batch_size=4", "rl.verify_chunk_size=4", "rl.per_device_batch_size=4", "prompt.mode=plain",
        "rl.gradient_accumulation_steps=1", "rl.learning_rate=0.001", "sft.max_seq_len=8192", "lora.r=4",
        "rl.init=base", "rl.max_turns=3", "rl.temperature=1.0", *extra,
    ])
    paths = RunPaths.from_config(cfg)
    paths.processed.mkdir(parents=True, exist_ok=True)
    paths.rl_tasks.write_text("".join(json.dumps(t) + "\n" for t in tiny_rl_tasks(2, levels=(1,))))
    return cfg, paths


def test_round_refines_on_feedback_logs_every_turn_and_reports_metrics(tmp_path, model_dir):
    from extensions.training.rl import run_rl

    # A budget no prompt meets: every refinement prompt keeps only the latest earlier turn.
    cfg, paths = _config(tmp_path, model_dir, ["rl.algorithm=grpo", "prompt.max_prompt_tokens=1"])
    verifier = ScriptedVerifier()
    assert run_rl(cfg, progress=False, verify_fn=verifier).status == "finished"

    records = json_records(paths.rl_candidates_log(1))
    assert records[0]["turns"] == {"max_turns": 3, "max_prompt_tokens": 1}
    samples = {(r["task_id"], r["sample_index"], r["turn"]): r for r in records if r["type"] == "sample"}
    verdicts = [(r["task_id"], r["sample_index"], r["turn"]) for r in records if r["type"] == "verdict"]
    # sample 0 stops once correct (turn 2); samples 1 and 2 use all three turns
    assert sorted(samples) == sorted(verdicts) and len(verdicts) == len(set(verdicts)) == 2 * (2 + 3 + 3)
    assert sorted(verifier.labels) == sorted(f"r1/{t}/{i}/turn{n}" for t, i, n in samples)
    task = samples[(records[0]["task_ids"][0], 1, 1)]
    first_prompt = task["prompt"]
    second = samples[(records[0]["task_ids"][0], 1, 2)]
    third = samples[(records[0]["task_ids"][0], 1, 3)]
    assert second["prompt"][:len(first_prompt)] == first_prompt
    assert second["prompt"][len(first_prompt)] == {"role": "assistant", "content": task["text"]}
    assert "numerical mismatch" in second["prompt"][-1]["content"] and second["turns_dropped"] == 0
    # turn 3 shows turn 2's answer and feedback only: turn 1 was dropped to save tokens
    assert third["turns_dropped"] == 1 and third["prompt"][len(first_prompt)]["content"] == second["text"]
    assert len(third["prompt"]) == len(first_prompt) + 2
    assert all(len(r["token_ids"]) == len(r["logprobs"]) > 0 for r in samples.values())

    round_row = [json.loads(line) for line in paths.metrics_log("rl").read_text().splitlines()
                 if json.loads(line)["kind"] == "round"][-1]
    turns = round_row["multiturn"]
    assert turns["trajectories"] == 6 and turns["success_rate"] == pytest.approx(2 / 6)
    assert turns["average_turns_used"] == pytest.approx((2 + 3 + 3) / 3)
    assert {t: e["answered"] for t, e in turns["per_turn"].items()} == {"1": 6, "2": 6, "3": 4}
    assert turns["per_turn"]["2"]["correct_rate"] == pytest.approx(2 / 6)
    assert turns["per_turn"]["3"]["correct_rate"] == 0.0 and turns["per_turn"]["1"]["compile_rate"] == 1.0
    assert [turns["per_turn"][t]["solved_share"] for t in "123"] == pytest.approx([0.0, 2 / 6, 2 / 6])
    assert turns["best_stage_share"]["full"] == pytest.approx(2 / 6)
    assert turns["prompt_turns_dropped"] == 4  # the four turn-3 prompts
    assert turns["prompts_over_budget"] == 16
    assert round_row["candidates"] == 16 and round_row["trained_samples"] == 16  # every turn is a sample
    assert sum(round_row["advantage_histogram"]["counts"]) == 16

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(paths.tensorboard("rl")))
    events.Reload()
    assert "round/multiturn/success_rate" in events.Tags()["scalars"]
    assert "round/multiturn/per_turn/2/correct_rate" in events.Tags()["scalars"]


class RenderCountingTokenizer:
    """A tokenizer that notes every chat prompt rendered through it, in order (``events``)."""

    def __init__(self, tokenizer, events: list):
        self.inner, self.events = tokenizer, events

    def apply_chat_template(self, messages, **kwargs):
        self.events.append(("render", json.dumps(messages, sort_keys=True)))
        return self.inner.apply_chat_template(messages, **kwargs)

    def __call__(self, *args, **kwargs):
        return self.inner(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_turn_renders_each_prompt_once_and_samples_the_tokens_that_prompt_gives(tmp_path, model_dir, monkeypatch):
    """Fitting a prompt to the budget, ordering prompts by length and sampling share one rendering
    per distinct prompt per turn (the samples of a task share their first prompt), and the sampler
    draws exactly what it draws when it renders the prompts itself."""
    import torch
    from transformers import AutoModelForCausalLM

    from extensions.models.loading import load_tokenizer
    from extensions.prompting.builder import PromptBuilder
    from extensions.generation.sampling import render_prompt_ids
    from extensions.training import rollouts
    from extensions.training.distributed import make_dist
    from extensions.models.tiny import tiny_rl_tasks
    from extensions.training.turn_rollouts import collect_trajectories

    # A budget no prompt meets: turn 3 renders each whole dialogue, then the one with turn 1 dropped.
    cfg, paths = _config(tmp_path, model_dir, ["prompt.max_prompt_tokens=1"])
    events: list[tuple[str, str]] = []
    tokenizer = RenderCountingTokenizer(load_tokenizer(cfg.model), events)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    sample = rollouts.sample_rollouts

    def checked_sample(model, tokenizer, prompts, n, params, *, progress=True, prompt_ids=None, should_stop=None):
        events.append(("sample", ""))
        assert prompt_ids == render_prompt_ids(tokenizer.inner, prompts)
        given = sample(model, tokenizer, prompts, n, params, progress=progress, prompt_ids=prompt_ids)
        rendered_here = sample(model, tokenizer.inner, prompts, n, params, progress=progress)
        assert [[seq.token_ids for _, seq in per_prompt] for per_prompt in given[1]] == \
            [[seq.token_ids for _, seq in per_prompt] for per_prompt in rendered_here[1]]
        return given

    monkeypatch.setattr(rollouts, "sample_rollouts", checked_sample)
    ctx = rollouts.RoundContext(cfg, paths, make_dist(cfg.model), tokenizer, ScriptedVerifier(), progress=False,
                                prompts=PromptBuilder())
    candidates, _ = collect_trajectories(ctx, model, 1, tiny_rl_tasks(2, levels=(1,)), "base")
    assert sorted({c.turn for c in candidates}) == [1, 2, 3] and max(c.turns_dropped for c in candidates) == 1

    turns: list[list[str]] = [[]]  # the prompts rendered between one turn's sampling and the next
    for kind, prompt in events:
        if kind == "sample" and turns[-1]:
            turns.append([])
        elif kind == "render":
            turns[-1].append(prompt)
    assert len(turns) == 3 + 1 and not turns[-1]
    for rendered in turns[:-1]:
        assert len(rendered) == len(set(rendered))
    rendered_anywhere = {prompt for rendered in turns for prompt in rendered}
    assert {json.dumps(c.prompt, sort_keys=True) for c in candidates} <= rendered_anywhere


def test_real_verdicts_become_the_next_turns_feedback(tmp_path, model_dir):
    """The project verifier judges the tiny model's answers in the interpreter; its verdict, as the
    feedback text, is the user turn the next turn is sampled after."""
    from extensions.prompting.feedback import build_feedback
    from extensions.training.rl import make_verify_fn, run_rl

    cfg, paths = _config(tmp_path, model_dir, ["rl.max_turns=2", "rl.tasks_per_round=1", "rl.samples_per_task=2",
                                               "rl.algorithm=best_of_n"])
    verify_fn = make_verify_fn(cfg.verifier, "cpu", progress=False)
    assert run_rl(cfg, progress=False, verify_fn=verify_fn).status == "finished"
    records = json_records(paths.rl_candidates_log(1))
    samples = {(r["sample_index"], r["turn"]): r for r in records if r["type"] == "sample"}
    verdicts = {(r["sample_index"], r["turn"]): r["result"] for r in records if r["type"] == "verdict"}
    assert sorted(samples) == sorted(verdicts) == [(0, 1), (0, 2), (1, 1), (1, 2)]  # random weights never solve
    for sample in (0, 1):
        feedback = build_feedback(VerifyResult.from_dict(verdicts[(sample, 1)])).text()
        assert feedback.startswith("Verifier result:")
        assert feedback in samples[(sample, 2)]["prompt"][-1]["content"]
        assert samples[(sample, 2)]["prompt"][-2] == {"role": "assistant", "content": samples[(sample, 1)]["text"]}


def test_best_of_n_round_trains_on_the_kept_dialogues(tmp_path, model_dir):
    from extensions.training.rl import run_rl

    cfg, paths = _config(tmp_path, model_dir, ["rl.algorithm=best_of_n", "rl.top_k=1", "rl.reward_threshold=0.5",
                                               "rl.max_turns=2"])
    assert run_rl(cfg, progress=False, verify_fn=ScriptedVerifier()).status == "finished"
    row = json.loads((paths.rl_round(1) / "round_metrics.json").read_text())
    # one fixed trajectory per task is kept, each trained as its two-answer dialogue
    assert row["kept"] == 2 and row["kept_tasks"] == 2 and row["train_examples"] == 2 and row["train_steps"] >= 1
