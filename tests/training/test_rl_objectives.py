"""RL objectives against hand-computed numbers: advantages, the clipped token loss and its gradient,
the KL penalty, normalisation, reward presets; then one batch through the tiny model per algorithm,
whose loss and LoRA gradients must equal the formulas evaluated token by token."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from extensions.config import PipelineConfig
from extensions.config.sections import RewardWeightsConfig
from extensions.training.objectives import make_objective
from extensions.training.objectives.grpo import STD_EPS, grpo_advantages
from extensions.training.objectives.policy_gradient import histogram
from extensions.training.objectives.policy_update import (PolicyUpdate, TrainSequence, UpdateSettings,
                                                          collate_sequences, plan_steps)
from extensions.training.objectives.reward_weighted import reward_weights
from extensions.training.objectives.rloo import rloo_advantages
from extensions.training.objectives.token_loss import ClipSettings, clipped_token_loss, normalisation_coefficients
from extensions.training.rewards import make_score_fn, staged_reward
from extensions.training.rollouts import Candidate
from extensions.verify.reward import reward_of


def _config(**rl):
    cfg = PipelineConfig()
    for key, value in rl.items():
        setattr(cfg.rl, key, value)
    return cfg


def _candidates(rewards_by_task: dict[str, list[float]]) -> list[Candidate]:
    return [Candidate(task, 1, i, f"{task}-{i}", {"reward": r}, score=r)
            for task, rewards in rewards_by_task.items() for i, r in enumerate(rewards)]


# -- advantages ------------------------------------------------------------------------------------------
def test_grpo_advantages_scaled_unscaled_and_flat_groups():
    # mean 0.5, sample std sqrt((0.25 + 0.25 + 0) / 2) = 0.5
    assert grpo_advantages([1.0, 0.0, 0.5], scale=True) == pytest.approx([0.5 / (0.5 + STD_EPS), -0.5 / (0.5 + STD_EPS), 0.0])
    assert grpo_advantages([1.0, 0.0, 0.5], scale=False) == pytest.approx([0.5, -0.5, 0.0])
    assert grpo_advantages([0.3, 0.3, 0.3], scale=True) == [0.0, 0.0, 0.0]
    objective = make_objective(_config(algorithm="grpo", scale_advantages=False))
    weights = objective.sample_weights(_candidates({"a": [1.0, 0.0, 0.5], "b": [0.3, 0.3, 0.3]}))
    assert weights == pytest.approx([0.5, -0.5, 0.0, 0.0, 0.0, 0.0])


def test_rloo_leaves_one_out():
    assert rloo_advantages([1.0, 0.0, 0.5]) == pytest.approx([1.0 - 0.25, 0.0 - 0.75, 0.5 - 0.5])
    assert rloo_advantages([0.7, 0.7]) == [0.0, 0.0]
    with pytest.raises(ValueError, match="samples_per_task >= 2"):
        make_objective(_config(algorithm="rloo", samples_per_task=1))


def test_reinforce_running_baseline_is_carried_between_rounds():
    objective = make_objective(_config(algorithm="reinforce", baseline_momentum=0.9))
    first = objective.sample_weights(_candidates({"a": [1.0, 0.0, 0.5], "b": [0.3, 0.3, 0.3]}))
    assert first == pytest.approx([0.6, -0.4, 0.1, -0.1, -0.1, -0.1])  # baseline = round mean 0.4
    restored = make_objective(_config(algorithm="reinforce", baseline_momentum=0.9))
    restored.load_state_dict(objective.state_dict())
    second = restored.sample_weights(_candidates({"a": [1.0, 1.0]}))
    assert second == pytest.approx([0.6, 0.6])  # still 0.4; flat groups train under a running baseline
    assert restored.state_dict()["baseline"] == pytest.approx(0.9 * 0.4 + 0.1 * 1.0)


def test_reward_weights_are_normalised_by_the_round_mean():
    assert reward_weights([1.0, 0.0, 0.5, 0.3, 0.3, 0.3]) == pytest.approx([2.5, 0.0, 1.25, 0.75, 0.75, 0.75])
    assert reward_weights([0.0, 0.0]) == [0.0, 0.0]


def test_histogram_counts_every_value():
    result = histogram([-1.0, -1.0, 0.0, 1.0], bins=4)
    assert result["edges"] == pytest.approx([-1.0, -0.5, 0.0, 0.5, 1.0])
    assert result["counts"] == [2, 0, 1, 1]


# -- the clipped loss ------------------------------------------------------------------------------------
def test_clipped_token_loss_values_gradients_and_clip_indicator():
    settings = ClipSettings(clip_eps_low=0.2, clip_eps_high=0.28, beta=0.0)
    old = torch.full((1, 5), math.log(0.5))
    ratios = torch.tensor([[1.5, 1.5, 0.5, 0.5, 1.1]])
    advantages = torch.tensor([[1.0, -1.0, 1.0, -1.0, 2.0]])
    new = (old + ratios.log()).requires_grad_(True)
    loss, clipped, ratio = clipped_token_loss(new, old, advantages, settings)
    # -min(r A, clip(r, 0.8, 1.28) A), token by token
    assert loss.detach()[0].tolist() == pytest.approx([-1.28, 1.5, -0.5, 0.8, -2.2])
    assert clipped[0].tolist() == [True, False, False, True, False]
    assert ratio.detach()[0].tolist() == pytest.approx(ratios[0].tolist())
    loss.sum().backward()
    # d/dlp of -r A is -r A where the unclipped branch is taken, 0 where clipping took over
    assert new.grad[0].tolist() == pytest.approx([0.0, 1.5, -0.5, 0.0, -2.2])


def test_kl_penalty_is_k3_with_its_gradient():
    settings = ClipSettings(beta=0.1)
    old = torch.zeros(1, 2)
    new = torch.zeros(1, 2, requires_grad=True)
    ref = torch.tensor([[math.log(2.0), 0.0]])
    loss, _, _ = clipped_token_loss(new, old, torch.tensor([0.0]), settings, ref)
    # exp(d) - d - 1 with d = ref - new: 2 - ln 2 - 1 and 0; gradient beta * (1 - exp(d))
    assert loss.detach()[0].tolist() == pytest.approx([0.1 * (1.0 - math.log(2.0)), 0.0])
    loss.sum().backward()
    assert new.grad[0].tolist() == pytest.approx([0.1 * (1.0 - 2.0), 0.0])
    with pytest.raises(ValueError, match="reference"):
        clipped_token_loss(new, old, torch.tensor([0.0]), settings, None)


def test_token_and_sequence_normalisation():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    token = normalisation_coefficients(mask, "token", step_tokens=8, step_sequences=4)
    assert token.tolist() == [[1 / 8, 1 / 8, 1 / 8, 0.0], [1 / 8, 0.0, 0.0, 0.0]]
    sequence = normalisation_coefficients(mask, "sequence", step_tokens=8, step_sequences=4)
    torch.testing.assert_close(sequence, torch.tensor([[1 / 12, 1 / 12, 1 / 12, 0.0], [1 / 4, 0.0, 0.0, 0.0]]))


def test_steps_give_every_rank_a_sequence():
    steps = plan_steps(9, per_step=4, world_size=2, seed=0)
    assert sorted(i for step in steps for i in step) == list(range(9))
    assert [len(s) for s in steps] == [4, 5]  # the lone ninth joins the step before it
    assert plan_steps(1, per_step=4, world_size=2, seed=0) == []
    assert plan_steps(9, 4, 2, seed=0) == steps and plan_steps(9, 4, 2, seed=1) != steps


# -- reward presets --------------------------------------------------------------------------------------
def test_reward_presets_follow_the_funnel_and_zero_cheating():
    cfg = PipelineConfig()
    full = {"stage": "full", "flags": [], "reward": 0.7}
    timed = {"stage": "timing", "flags": [], "speedup": 1.0, "reward": 0.85}
    cheat = {"stage": "timing", "flags": ["torch_compute"], "speedup": 3.0, "reward": 0.0}
    compiled = {"stage": "compile", "flags": [], "reward": 0.3}
    assert make_score_fn(cfg.rl)(Candidate("t", 1, 0, "", timed)) == 0.85  # default: the verifier's own reward
    for preset, expected in {"format": (0.7, 1.0, 1.0), "correctness": (0.1, 1.0, 1.0), "speed": (0.0, 0.5, 0.75)}.items():
        cfg.rl.reward_preset = preset
        score = make_score_fn(cfg.rl)
        assert (score(Candidate("t", 1, 0, "", compiled)), score(Candidate("t", 1, 0, "", full)),
                score(Candidate("t", 1, 0, "", timed))) == pytest.approx(expected), preset
        assert score(Candidate("t", 1, 0, "", cheat)) == 0.0
    # The reward table is the verifier's: each verdict carries its reward, and both names of the
    # table's preset read it.
    cfg.verifier.reward_weights = RewardWeightsConfig(compile=0.2, full=0.6, speed=0.4, speedup_saturation=4.0)
    verdict = {**timed, "speedup": 2.0}
    verdict["reward"] = reward_of(verdict, cfg.verifier.reward_weights)
    for preset in ("weights", "verifier"):
        cfg.rl.reward_preset = preset
        assert make_score_fn(cfg.rl)(Candidate("t", 1, 0, "", verdict)) == pytest.approx(0.6 + 0.4 * 0.5)
    review = {**timed, "speedup": 50.0, "flags": ["speedup_review"]}
    assert staged_reward(review, {**dict(RewardWeightsConfig().__dict__)}) == pytest.approx(0.7)


# -- one batch through the tiny model ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def lora_model():
    from extensions.config.sections import LoraConfig
    from extensions.models.loading import attach_lora
    from extensions.models.tiny import build_tiny_qwen2

    torch.manual_seed(0)
    model = attach_lora(build_tiny_qwen2(64, hidden_size=32, eos_token_id=1, pad_token_id=0),
                        LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj", "lm_head"]))
    with torch.no_grad():  # B starts at 0; make the adapter matter so the KL reference differs
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.2)
    return model


def _manual_loss(model, sequences, settings: UpdateSettings):
    """The objective evaluated token by token, one sequence at a time, from the formulas."""
    total_tokens = sum(len(s.completion_ids) for s in sequences)
    loss = torch.zeros(())
    for s in sequences:
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        logits = model(input_ids=ids).logits[0].float()
        with torch.no_grad(), model.disable_adapter():
            ref_logits = model(input_ids=ids).logits[0].float()
        for k, token in enumerate(s.completion_ids):
            position = len(s.prompt_ids) + k - 1  # the logits that predict completion token k
            lp = torch.log_softmax(logits[position] / settings.temperature, dim=-1)[token]
            if settings.loss == "weighted_nll":
                token_loss = -s.weight * lp
            else:
                ratio = torch.exp(lp - s.old_logprobs[k])
                low, high = 1 - settings.clip.clip_eps_low, 1 + settings.clip.clip_eps_high
                token_loss = -torch.minimum(ratio * s.weight, torch.clamp(ratio, low, high) * s.weight)
                if settings.clip.beta:
                    ref = torch.log_softmax(ref_logits[position] / settings.temperature, dim=-1)[token]
                    token_loss = token_loss + settings.clip.beta * (torch.exp(ref - lp) - (ref - lp) - 1)
            if settings.normalization == "token":
                loss = loss + token_loss / total_tokens
            else:
                loss = loss + token_loss / len(s.completion_ids) / len(sequences)
    return loss


@pytest.mark.parametrize("algorithm, overrides", [
    ("grpo", {"temperature": 0.7}),
    ("rloo", {"loss_normalization": "sequence"}),
    ("reinforce", {"beta": 0.1, "clip_eps_low": 0.05, "clip_eps_high": 0.05}),
    ("reward_weighted", {}),
])
def test_one_batch_matches_the_formulas(lora_model, algorithm, overrides):
    from extensions.training.distributed import make_dist

    cfg = _config(algorithm=algorithm, samples_per_task=3, **overrides)
    objective = make_objective(cfg)
    candidates = _candidates({"a": [1.0, 0.0, 0.5]})
    weights = objective.sample_weights(candidates)
    completions = [[5, 9, 1], [7, 1], [11, 12, 13, 14]]
    prompt = [3, 4, 8, 2]
    settings = objective.update_settings()
    # the sampler's log-probs: the model's own, shifted so some ratios leave the clip range both ways
    shifts = [0.3, -0.4, 0.02, 0.1, -0.05]
    sequences = []
    for completion, weight in zip(completions, weights):
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            logits = lora_model(input_ids=ids).logits[0]
        old = [float(torch.log_softmax(logits[len(prompt) + k - 1] / settings.temperature, -1)[t]) - shifts[(k + len(sequences)) % 5]
               for k, t in enumerate(completion)]
        sequences.append(TrainSequence(prompt, completion, old, weight))

    update = PolicyUpdate(SimpleNamespace(trainer=None, dist=make_dist(cfg.model)), settings)
    lora_model.zero_grad()
    batch = collate_sequences(sequences, pad_token_id=0)
    loss, stats = update.micro_batch_loss(lora_model, batch, sum(len(c) for c in completions), len(sequences))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in lora_model.named_parameters() if p.requires_grad}
    lora_model.zero_grad()
    expected = _manual_loss(lora_model, sequences, settings)
    expected.backward()
    assert float(loss.detach()) == pytest.approx(float(expected.detach()), rel=1e-5, abs=1e-7)
    assert any(g.abs().sum() > 0 for g in grads.values())
    for name, param in lora_model.named_parameters():
        if param.requires_grad:
            torch.testing.assert_close(grads[name], param.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert stats["tokens"] == sum(len(c) for c in completions)
    if algorithm == "reinforce":
        assert stats["clipped_sum"] > 0 and stats["ref_kl_sum"] > 0


def test_sampler_log_probs_are_the_training_forward_at_the_same_temperature(lora_model):
    """No second forward for the old policy: the decoder's log-probs (tempered full distribution,
    before top-p) are what the update's forward computes, so the first ratio is 1."""
    from extensions.generation.sampling import SamplingParams, sample_token_ids
    from extensions.training.objectives.policy_update import token_logprobs

    prompts = [[3, 4, 8, 2], [5, 6]]
    params = SamplingParams(max_new_tokens=6, temperature=0.7, top_p=0.9, seed=3, batch_size=4, cuda_graphs=False)
    sampled = sample_token_ids(lora_model, prompts, 2, params, pad_token_id=0, eos_token_ids=[1], progress=False,
                               with_logprobs=True)
    sequences = [TrainSequence(prompt, seq.token_ids, seq.logprobs, 1.0) for prompt, row in zip(prompts, sampled) for seq in row]
    assert all(len(s.completion_ids) == len(s.old_logprobs) > 0 for s in sequences)
    batch = collate_sequences(sequences, pad_token_id=0)
    with torch.no_grad():
        new, _ = token_logprobs(lora_model, batch, 0.7)
    torch.testing.assert_close(new[batch["mask"]], batch["old_logprobs"][batch["mask"]], rtol=0, atol=1e-4)


def test_unusable_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="rl.temperature must be > 0 for grpo"):
        make_objective(_config(algorithm="grpo", temperature=0.0))
    with pytest.raises(ValueError, match="rl.ppo_epochs"):
        make_objective(_config(algorithm="rloo", ppo_epochs=0))
    with pytest.raises(ValueError, match="rl.clip_eps_low"):
        make_objective(_config(algorithm="grpo", clip_eps_low=1.5))
    assert make_objective(_config(temperature=0.0)).name == "best_of_n"  # greedy Best-of-N is allowed


def test_unknown_algorithm_or_preset_stops_the_config_loader(project_root):
    from extensions.config import load_config

    with pytest.raises(Exception, match="rl.algorithm"):
        load_config(project_root / "configs" / "smoke.yaml", ["rl.algorithm=ppo"])
    with pytest.raises(Exception, match="rl.reward_preset"):
        load_config(project_root / "configs" / "smoke.yaml", ["rl.reward_preset=vibes"])
    cfg = load_config(project_root / "configs" / "default.yaml")
    assert (cfg.rl.algorithm, cfg.rl.reward_preset, cfg.rl.beta) == ("best_of_n", "verifier", 0.0)
