"""One sampling step: a repetition penalty, temperature, min-p, top-k and top-p (nucleus) truncation, a draw, and
its log-probability.

The log-probability returned is of the distribution the token was actually drawn from,
``mu(y) = softmax(logits / temperature)`` (of the penalised logits, when a repetition penalty is on) restricted to
the tokens the truncations keep and renormalised, because
that is the ``mu_old`` of the paper's importance weight (design.md, "Contracts"). A log-prob of
the untruncated or untempered law would make the IS weight wrong.

Truncations, in vLLM's order (v1 sampler: temperature, then min-p, then top-k and top-p together): min-p drops
tokens whose tempered probability is below ``min_p`` times the largest one; top-k keeps the ``top_k`` most
probable (ties at the k-th value all kept, as a threshold on the logit); top-p is then taken over what is left,
renormalised. ``top_k`` 0 and ``min_p`` 0 are off.

The repetition penalty (Keskar et al. 2019, CTRL, Sec. 4.1; Hugging Face's ``RepetitionPenaltyLogitsProcessor``,
vLLM's ``repetition_penalty``, TRL's and verl's setting of that name) comes first, on the raw logits, as in both: a
token already seen in the row (its prompt or its completion so far) has its logit divided by the penalty when
positive and multiplied by it otherwise. 1 is off. It makes ``mu`` differ from the trainer's ``pi`` on purpose;
``logp_rollout`` is of the penalised law, so the importance weight ``pi/mu`` sees that gap as it sees any other.

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

from minirl.types import SamplingParams


def validate_sampling(temperature: float, top_p: float, top_k: int = 0, min_p: float = 0.0,
                      repetition_penalty: float = 1.0) -> None:
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
    if not (repetition_penalty > 0.0 and math.isfinite(repetition_penalty)):
        raise ValueError(f"sampling.repetition_penalty must be > 0 (got {repetition_penalty}; 1 is off)")


def seen_tokens(prompt_ids: list[list[int]], group: int, vocab: int, device: torch.device | str,
                spare_rows: int = 0) -> torch.Tensor:
    """The repetition penalty's memory: bool [len(prompt_ids) x group + spare_rows, vocab], True where a row's
    prompt holds the token (rows grouped by prompt, ``group`` each; spare rows empty). Ids at or past ``vocab``
    (tokens the LM head cannot produce) are ignored."""
    seen = torch.zeros(len(prompt_ids) * group + spare_rows, vocab, dtype=torch.bool)
    for index, ids in enumerate(prompt_ids):
        kept = [token for token in ids if 0 <= token < vocab]
        seen[index * group: (index + 1) * group, kept] = True
    return seen.to(device)


def penalize_repetitions(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's repetition penalty (Keskar et al. 2019, Sec. 4.1; as Hugging Face and vLLM write it): ``logits`` [B, V]
    with each ``seen`` [B, V] token's logit divided by ``penalty`` where positive, multiplied where not."""
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalized, logits)


def sample_next(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | list[torch.Generator] | None,
    forced_tokens: torch.Tensor | None = None,
    top_k: int = 0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    seen: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of ``logits`` [B, V]; return ``(tokens long [B], logp float32 [B])``.

    ``forced_tokens`` [B] skips the draw and returns the log-probabilities of those tokens under
    the same tempered, truncated law (used to score given completions through the engine's path).
    A forced token outside the nucleus gets ``-inf``. ``generator`` is one stream for the whole
    batch, or a list of one stream per row (each row's draw then depends on its own stream only).
    ``seen`` [B, V] (bool, ``seen_tokens``): the tokens a ``repetition_penalty`` other than 1 penalises per row.
    """
    if repetition_penalty != 1.0:
        if seen is None:
            raise ValueError("a repetition_penalty needs the rows' seen tokens")
        logits = penalize_repetitions(logits.float(), seen, repetition_penalty)
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


class Draw:
    """One rollout's sampling steps: ``sample_next`` under the law of ``sampling`` and, with a repetition penalty,
    each row's seen tokens (its prompt, then every token drawn or forced for it), kept by original row (prompt-major,
    ``group`` per prompt; ``spare_rows`` more for a caller's scratch slots)."""

    def __init__(self, sampling: SamplingParams, prompt_ids: list[list[int]], group: int, spare_rows: int = 0) -> None:
        self.sampling, self.prompt_ids, self.group, self.spare_rows = sampling, prompt_ids, group, spare_rows
        self.seen: torch.Tensor | None = None

    def __call__(self, logits: torch.Tensor, rows: torch.Tensor, generator: torch.Generator | list[torch.Generator] | None,
                 forced_tokens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``sample_next`` for ``logits`` [b, V] of the original ``rows`` [b]."""
        s, seen = self.sampling, None
        if s.repetition_penalty != 1.0:
            if self.seen is None:  # the LM head's width is known at the first step
                self.seen = seen_tokens(self.prompt_ids, self.group, logits.shape[-1], logits.device, self.spare_rows)
            seen = self.seen[rows]
        tokens, logp = sample_next(logits, s.temperature, s.top_p, generator, forced_tokens, top_k=s.top_k, min_p=s.min_p,
                                   repetition_penalty=s.repetition_penalty, seen=seen)
        if self.seen is not None:
            self.seen[rows, tokens] = True
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
