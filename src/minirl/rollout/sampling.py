"""One sampling step: temperature, min-p, top-k and top-p (nucleus) truncation, a draw, and its log-probability.

The log-probability returned is of the distribution the token was actually drawn from,
``mu(y) = softmax(logits / temperature)`` restricted to the tokens the truncations keep and renormalised, because
that is the ``mu_old`` of the paper's importance weight (design.md, "Contracts"). A log-prob of
the untruncated or untempered law would make the IS weight wrong.

Truncations, in vLLM's order (v1 sampler: temperature, then min-p, then top-k and top-p together): min-p drops
tokens whose tempered probability is below ``min_p`` times the largest one; top-k keeps the ``top_k`` most
probable (ties at the k-th value all kept, as a threshold on the logit); top-p is then taken over what is left,
renormalised. ``top_k`` 0 and ``min_p`` 0 are off.

Top-p rule (as vLLM and Hugging Face): sort tokens by probability, keep the smallest prefix whose
mass reaches ``top_p`` (a token is kept when the mass strictly before it is below ``top_p``), so
at least one token is always kept. Ties at the boundary are broken by the sort order.

The draw uses the exponential race (Gumbel-max): ``argmax(logits_scaled - log(E))`` with
``E ~ Exp(1)`` i.i.d. per (row, vocabulary entry), which samples exactly from
``softmax(logits_scaled)`` and needs one batched noise tensor per step, no ``multinomial``.

Temperature 0 is greedy decoding (the limit of the tempered law): the most probable token, ties to the
lowest id, with ``top_p`` moot. Its law is a point mass, so the log-probability returned is 0 for the
chosen token (and ``-inf`` for a forced token that is not the argmax). That is no ``mu_old`` an
importance weight can use, which is why the config allows it for evaluation only (verl's validation
default, ``val_kwargs.temperature: 0``), never for training rollouts.
"""

from __future__ import annotations

import math

import torch


def validate_sampling(temperature: float, top_p: float, top_k: int = 0, min_p: float = 0.0) -> None:
    """Raise ``ValueError`` on a temperature, top-p, top-k or min-p the sampler cannot honour.

    ``temperature`` must be >= 0 (0 = greedy, whose point-mass law gives no usable ``mu_old``: the
    config allows it only at evaluation, see the module docstring).
    """
    if not temperature >= 0.0:
        raise ValueError(f"sampling.temperature must be >= 0 (got {temperature}; 0 is greedy)")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"sampling.top_p must be in (0, 1] (got {top_p})")
    if not top_k >= 0:
        raise ValueError(f"sampling.top_k must be >= 0 (got {top_k}; 0 is off)")
    if not 0.0 <= min_p < 1.0:
        raise ValueError(f"sampling.min_p must be in [0, 1) (got {min_p}; 0 is off)")


def sample_next(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | list[torch.Generator] | None,
    forced_tokens: torch.Tensor | None = None,
    top_k: int = 0,
    min_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of ``logits`` [B, V]; return ``(tokens long [B], logp float32 [B])``.

    ``forced_tokens`` [B] skips the draw and returns the log-probabilities of those tokens under
    the same tempered, truncated law (used to score given completions through the engine's path).
    A forced token outside the nucleus gets ``-inf``. ``generator`` is one stream for the whole
    batch, or a list of one stream per row (each row's draw then depends on its own stream only).
    """
    if temperature == 0.0:
        return _greedy(logits, forced_tokens)
    scaled = logits.float()
    if temperature != 1.0:
        scaled = scaled / temperature
    if min_p > 0.0:  # probability below min_p x the largest: log p < log min_p + max log p
        log_probs = scaled.log_softmax(dim=-1)
        scaled = scaled.masked_fill(log_probs < log_probs.amax(dim=-1, keepdim=True) + math.log(min_p), float("-inf"))
    if 0 < top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
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


def _greedy(logits: torch.Tensor, forced_tokens: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy decoding's step: the argmax token (ties to the lowest id) and its point-mass log-prob, 0;
    a forced token gets 0 when it is the argmax and ``-inf`` otherwise."""
    best = logits.argmax(dim=-1)
    tokens = best if forced_tokens is None else forced_tokens
    logp = torch.where(tokens == best, 0.0, float("-inf")).to(torch.float32)
    return tokens, logp


def _mask_outside_nucleus(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """``scaled`` with every token outside the top-p nucleus set to ``-inf`` (a new tensor)."""
    sorted_scaled, order = scaled.sort(dim=-1, descending=True)
    sorted_probs = sorted_scaled.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return scaled.masked_fill(drop, float("-inf"))
