"""Entropy bonus, subtracted from the policy loss (``algo.entropy_coef``).

Off by default: the paper's MiniRL (arXiv 2512.01374, Eq. 7) has none, nor its GRPO/CISPO baselines
(Appendix A). It is PPO's entropy term (Schulman et al. 2017, arXiv 1707.06347, Eq. 9:
L = L^CLIP - c_2 S[pi_theta]) as verl applies it (``actor.entropy_coeff``, aggregated with the
policy loss's ``loss_agg_mode``, token-mean by default) and TRL (``entropy_coef``, the per-token mean):

    loss = -entropy_coef * sum_{b,t} mask_bt H_bt / normalizer,   normalizer = sum of mask over the mini-batch

with H_bt the full-vocabulary entropy of pi_theta at position t of row b
(``minirl.algo.logprobs.token_entropy_with_grad``). The gradient flows through H (through the logits
of every vocabulary entry, not only the sampled token's).

``high_entropy_tokens``: the other use of that entropy, "Beyond the 80/20 rule" (Wang et al. 2025, arXiv
2506.01939; TRL's ``top_entropy_quantile``): only the top fraction of tokens by entropy keep their policy-gradient term.
"""

from __future__ import annotations

import torch


def entropy_bonus_loss(
    entropy: torch.Tensor, mask: torch.Tensor, *, entropy_coef: float, normalizer: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``-entropy_coef`` x the masked token sum of ``entropy`` [B, T] / ``normalizer``; metrics:
    ``entropy``, the masked token mean of pi_theta's entropy in this call (detached)."""
    if not normalizer > 0:
        raise ValueError(f"normalizer must be > 0, got {normalizer}")
    if entropy.shape != mask.shape:
        raise ValueError(f"entropy shape {tuple(entropy.shape)} != mask shape {tuple(mask.shape)}")
    kept = torch.where(mask, entropy, 0.0)
    loss = -entropy_coef * kept.sum() / normalizer
    return loss, {"entropy": kept.detach().sum() / mask.sum().clamp(min=1)}


def high_entropy_tokens(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """bool [B, T]: the trained tokens (``mask``) whose detached entropy is at least the (1 - ``quantile``)
    quantile of the trained tokens' entropies (linear interpolation, as ``torch.quantile``): TRL's
    ``get_high_entropy_mask``. No host sync (the quantile of the masked values ignores the others as NaN)."""
    if not 0 < quantile <= 1:
        raise ValueError(f"quantile must be in (0, 1], got {quantile!r}")
    values = entropy.detach().float().masked_fill(~mask, torch.nan).flatten()
    threshold = torch.nanquantile(values, 1 - quantile)  # NaN when no token is trained: nothing kept
    return mask & (entropy.detach() >= threshold)


def adaptive_entropy_coef(coef: float, entropy: float, *, target: float, delta: float, low: float, high: float) -> float:
    """Skywork-OR1's adaptive entropy control (arXiv 2505.22312, §4; TRL's ``use_adaptive_entropy``): the coefficient
    after an update whose token-mean entropy was ``entropy``: ``coef + delta`` (at most ``high``) when ``entropy`` <=
    ``target``, else ``coef - delta`` (at least ``low``). The next update applies it only while ``entropy`` <= ``target``."""
    return min(coef + delta, high) if entropy <= target else max(coef - delta, low)
