"""``optim.logprob_chunk_tokens``: the LM head and the log-softmax, a chunk of completion tokens at a time.

The trainer needs one number per completion token, log pi(y_t), but the plain forward builds the logits of every
position, prompt included: a [B, S, V] tensor, its float32 copy and, in the backward, a softmax of the same size.
With a 152k vocabulary (Qwen3) that is ~10 GB per 16k-token micro-batch in float32, the largest tensors of an RL
update. Here the model's forward stops at its final hidden states (the head is swapped for an identity while it
runs); the head then runs on the completion tokens only, ``chunk_tokens`` at a time, each chunk's logits recomputed
in the backward (``torch.utils.checkpoint``) instead of kept: verl's ``use_fused_kernels`` and TRL's Liger loss
(``use_liger_kernel``) do the same with fused kernels. Peak memory then holds [chunk, V], never [B, S, V]; the cost
is the head's matmul once more in the backward, and less work where prompts are long.

Each chunk's log-probs and entropies are ``minirl.algo.token_logprobs`` / ``token_entropy_with_grad`` / the monitor's
``token_entropy`` of its logits, as on the whole tensor; the head runs in the trainer's compute context (bf16
logits upcast after it, as before). A model whose forward changes its logits after the head (a soft cap, a scale)
is refused in one line when the trainer is built.

Under FSDP2 ranks the head stays in the root's group, which FSDP2 keeps gathered from the root's forward to the end of
its backward: the chunks, and their recomputation in the backward, use the gathered weight, and its gradient joins
the root's reduce-scatter; no collective is added, so the ranks' differing chunk counts cannot desynchronise them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from minirl.algo.logprobs import token_entropy_with_grad, token_logprobs
from minirl.monitor.mismatch import token_entropy, token_sum_pi_squared


class LogprobHeadError(ValueError):
    """The model cannot run ``optim.logprob_chunk_tokens`` (one line)."""


class LogprobHead:
    """The LM head of ``model``, applied a chunk of ``chunk_tokens`` completion tokens at a time."""

    def __init__(self, model: nn.Module, chunk_tokens: int) -> None:
        find = getattr(model, "get_output_embeddings", None)
        head = find() if callable(find) else None
        if not isinstance(head, nn.Module):
            raise LogprobHeadError(f"optim.logprob_chunk_tokens: {type(model).__name__} has no LM head "
                                   "(get_output_embeddings); set it to null")
        self.model, self.head, self.chunk_tokens = model, head, int(chunk_tokens)
        self.parent, self.name = _holder(model, head)

    @contextmanager
    def hidden_states(self) -> Iterator[None]:
        """Inside, the model's forward returns its final hidden states [B, S, H] where it returned logits."""
        setattr(self.parent, self.name, nn.Identity())
        try:
            yield
        finally:
            setattr(self.parent, self.name, self.head)

    @torch.no_grad()
    def check(self, device: torch.device) -> None:
        """One line unless the model's logits are its head applied to its final hidden states (a 4-token forward)."""
        ids = torch.arange(1, 5, device=device)[None]
        logits = self.model(input_ids=ids, use_cache=False).logits.float()
        with self.hidden_states():
            hidden = self.model(input_ids=ids, use_cache=False).logits
        try:
            mine = self.head(hidden).float()
        except RuntimeError:  # the forward did not go through the swapped head: these are logits already
            mine = None
        if mine is None or mine.shape != logits.shape or not torch.allclose(mine, logits, rtol=1e-4, atol=1e-5):
            raise LogprobHeadError(f"optim.logprob_chunk_tokens: {type(self.model).__name__} changes its logits after its LM "
                                   "head (a soft cap or a scale); set it to null")

    def terms(self, hidden: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, entropy: str | None,
              context: Callable[[], AbstractContextManager[Any]] = nullcontext, temperature: float = 1.0,
              sum_pi_squared: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """log pi(y_t) [b, T] float32 at the ``mask`` positions (0 elsewhere; a host tensor sizes the chunks without
        a device sync) from ``hidden`` [b, T, H], the states before each target of ``targets`` [b, T]; with
        ``entropy`` ``"detached"`` or ``"grad"``, the full-vocabulary entropy there too (differentiable with
        ``"grad"``), and with ``sum_pi_squared`` each position's sum_w pi(w)^2 (detached; else None). ``context``: the
        compute context the head runs in; ``temperature``: the logits' divisor. No position on the mask: zeros that still
        reach ``hidden`` (a backward through them gives zero gradients, as the whole path's masked terms do)."""
        b, t = targets.shape
        where = mask.reshape(-1).nonzero().squeeze(1).to(hidden.device)  # a host mask: no device sync
        states = hidden.reshape(b * t, -1).index_select(0, where)
        wanted = targets.reshape(-1).index_select(0, where)
        logps, entropies, squares = [], [], []
        for start in range(0, len(where), self.chunk_tokens):
            part = (states[start:start + self.chunk_tokens], wanted[start:start + self.chunk_tokens])
            if torch.is_grad_enabled() and states.requires_grad:  # the chunk's logits recomputed in the backward
                logp, ent, sq = checkpoint(self._chunk, *part, entropy, context, temperature, sum_pi_squared,
                                           use_reentrant=False)
            else:
                logp, ent, sq = self._chunk(*part, entropy, context, temperature, sum_pi_squared)
            logps.append(logp)
            entropies.append(ent)
            squares.append(sq)

        def spread(values: list[torch.Tensor]) -> torch.Tensor:  # the mask's positions back in [b, t]
            return hidden.new_zeros(b * t, dtype=torch.float32).index_copy(0, where, _cat(values, hidden)).view(b, t)

        return (spread(logps), None if entropy is None else spread(entropies),
                spread(squares) if sum_pi_squared else None)

    def _chunk(self, states: torch.Tensor, wanted: torch.Tensor, entropy: str | None,
               context: Callable[[], AbstractContextManager[Any]], temperature: float,
               sum_pi_squared: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with context():
            logits = self.head(states)
        logits = logits.float()[None]  # [1, n, V], as the whole-tensor path upcasts it
        if temperature != 1.0:
            logits = logits / temperature
        logp = token_logprobs(logits, wanted[None])[0]
        squares = token_sum_pi_squared(logits.detach())[0] if sum_pi_squared else logp.new_zeros(())
        if entropy == "grad":
            return logp, token_entropy_with_grad(logits)[0], squares
        if entropy == "detached":
            return logp, token_entropy(logits.detach())[0], squares
        return logp, logp.new_zeros(()), squares


def _cat(parts: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """The chunks' values in order; none: an empty slice of ``like``, so the result stays in its graph."""
    return torch.cat(parts) if parts else like.reshape(-1)[:0].float()


def _holder(model: nn.Module, head: nn.Module) -> tuple[nn.Module, str]:
    """The module that holds ``head`` as an attribute, and the attribute's name."""
    for module in model.modules():
        for child_name, child in module.named_children():
            if child is head:
                return module, child_name
    raise LogprobHeadError(f"optim.logprob_chunk_tokens: {type(model).__name__}'s LM head is not one of its modules")


__all__ = ["LogprobHead", "LogprobHeadError"]
