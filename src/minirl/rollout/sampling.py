"""One sampling step: temperature, top-p (nucleus) truncation, a draw, and its log-probability.

The log-probability returned is of the distribution the token was actually drawn from,
``mu(y) = softmax(logits / temperature)`` restricted to the nucleus and renormalised, because
that is the ``mu_old`` of the paper's importance weight (design.md, "Contracts"). A log-prob of
the untruncated or untempered law would make the IS weight wrong.

Top-p rule (as vLLM and Hugging Face): sort tokens by probability, keep the smallest prefix whose
mass reaches ``top_p`` (a token is kept when the mass strictly before it is below ``top_p``), so
at least one token is always kept. Ties at the boundary are broken by the sort order.

The draw uses the exponential race (Gumbel-max): ``argmax(logits_scaled - log(E))`` with
``E ~ Exp(1)`` i.i.d. per (row, vocabulary entry), which samples exactly from
``softmax(logits_scaled)`` and needs one batched noise tensor per step, no ``multinomial``.
"""

from __future__ import annotations

import torch


def validate_sampling(temperature: float, top_p: float) -> None:
    """Raise ``ValueError`` on a temperature or top-p the sampler cannot honour.

    ``temperature`` must be > 0: greedy decoding has no proper sampling law, so its ``mu_old``
    (a point mass) would make every IS weight meaningless. Use a small temperature instead.
    """
    if not temperature > 0.0:
        raise ValueError(f"sampling.temperature must be > 0 (got {temperature}); greedy is not a sampling law")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"sampling.top_p must be in (0, 1] (got {top_p})")


def sample_next(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | list[torch.Generator] | None,
    forced_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of ``logits`` [B, V]; return ``(tokens long [B], logp float32 [B])``.

    ``forced_tokens`` [B] skips the draw and returns the log-probabilities of those tokens under
    the same tempered, truncated law (used to score given completions through the engine's path).
    A forced token outside the nucleus gets ``-inf``. ``generator`` is one stream for the whole
    batch, or a list of one stream per row (each row's draw then depends on its own stream only).
    """
    scaled = logits.float()
    if temperature != 1.0:
        scaled = scaled / temperature
    if top_p < 1.0:
        scaled = _mask_outside_nucleus(scaled, top_p)
    if forced_tokens is None:
        if isinstance(generator, list):
            noise = torch.stack([torch.empty_like(row).exponential_(generator=g) for row, g in zip(scaled, generator)])
        else:
            noise = torch.empty_like(scaled).exponential_(generator=generator)
        noise = noise.log_()
        tokens = (scaled - noise).argmax(dim=-1)
    else:
        tokens = forced_tokens
    # log mu(y) = scaled[y] - logsumexp(scaled over the kept tokens); masked entries are -inf
    logp = scaled.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
    return tokens, logp


def _mask_outside_nucleus(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """``scaled`` with every token outside the top-p nucleus set to ``-inf`` (a new tensor)."""
    sorted_scaled, order = scaled.sort(dim=-1, descending=True)
    sorted_probs = sorted_scaled.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return scaled.masked_fill(drop, float("-inf"))
