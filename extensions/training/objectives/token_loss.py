"""Per-token losses of the policy-gradient objectives and how they are normalised.

For a completion token with new log-probability ``lp``, sampling-policy log-probability ``lp_old``
and sequence advantage ``A``:

    ratio     = exp(lp - lp_old)
    pg        = -min(ratio * A, clip(ratio, 1 - clip_eps_low, 1 + clip_eps_high) * A)
    kl        = exp(lp_ref - lp) - (lp_ref - lp) - 1          (k3 estimator, >= 0; only when beta > 0)
    loss_t    = pg + beta * kl

Reward-weighted SFT uses ``loss_t = -w * lp`` (the SFT cross-entropy of the sampled token, weighted).

Normalisation over an optimizer step (all ranks): ``token`` divides the summed token losses by the
number of completion tokens in the step (every token weighs the same, so long completions are not
down-weighted: DAPO, Dr. GRPO); ``sequence`` averages each sequence over its own tokens first, then
over the step's sequences (the original GRPO).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ClipSettings:
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    beta: float = 0.0


def clipped_token_loss(new_logprobs, old_logprobs, advantages, settings: ClipSettings, ref_logprobs=None):
    """(loss per token, clipped indicator per token, ratio per token); shapes (batch, tokens).

    ``advantages`` has one value per sequence (batch,) or per token (batch, tokens). The clipped
    indicator is true where the clipped branch is the one taken and it differs from the unclipped
    one, i.e. where the token's gradient is zero because of clipping.
    """
    import torch

    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    ratio = torch.exp(new_logprobs - old_logprobs)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - settings.clip_eps_low, 1.0 + settings.clip_eps_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    was_clipped = clipped < unclipped
    if settings.beta > 0:
        if ref_logprobs is None:
            raise ValueError("beta > 0 needs the reference policy's log-probabilities")
        delta = ref_logprobs - new_logprobs
        loss = loss + settings.beta * (torch.exp(delta) - delta - 1.0)
    return loss, was_clipped, ratio


def weighted_nll_token_loss(new_logprobs, weights):
    """Reward-weighted SFT: ``-w * lp`` per token; ``weights`` one per sequence (batch,)."""
    return -weights[:, None] * new_logprobs


def normalisation_coefficients(mask, mode: str, step_tokens: int, step_sequences: int):
    """Per-token coefficients whose weighted sum of token losses is the step's loss share.

    ``mask`` (batch, tokens) marks completion tokens; ``step_tokens`` / ``step_sequences`` count the
    whole optimizer step on every rank, so micro-batches and ranks add up to one normalised loss.
    """
    mask = mask.float()
    if mode == "token":
        return mask / max(1, step_tokens)
    if mode == "sequence":
        lengths = mask.sum(dim=1, keepdim=True).clamp(min=1.0)
        return mask / lengths / max(1, step_sequences)
    raise ValueError(f"unknown loss normalisation {mode!r} (token or sequence)")
