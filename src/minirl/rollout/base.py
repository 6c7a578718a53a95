"""The ``RolloutEngine`` protocol."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from minirl.types import Completion, Prompt, SamplingParams


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples completions and reports mu_old of every sampled token.

    ``generate`` returns ``len(prompts) * samples_per_prompt`` completions, grouped by prompt
    (all samples of prompt 0 first). Each completion's ``logp_rollout`` is the log-probability
    of the token under the distribution actually sampled from (temperature and top-p applied).
    With ``record_routes=True`` (MoE models, for R3) each completion carries its routes.
    ``load_weights`` takes the trainer's full state dict after every global step.
    """

    def generate(
        self,
        prompts: list[Prompt],
        samples_per_prompt: int,
        sampling: SamplingParams,
        record_routes: bool = False,
    ) -> list[Completion]: ...

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None: ...


@dataclass(frozen=True)
class DecodeControl:
    """One engine call that decodes each row to its own budget and may stop early (``rollout.partial_rollout``:
    a step's pool decoded in one call that keeps its KV cache, ``minirl.partial_rollout``). An engine that takes it
    has ``continues_in_call = True`` and ``generate(..., control=)``.

    ``max_new_tokens``: each row's budget (prompt-major, ``samples_per_prompt`` rows per prompt), each >= 1; a row
    that reaches it ends there. ``stop(ended)``: asked after every ``check_every_tokens``-th decode step with which
    rows have ended (a stop token or string, or their budget); True stops the call there, the rows still running
    keeping the tokens they have (finish ``"length"``, short of their budget)."""

    max_new_tokens: list[int]
    stop: Callable[[list[bool]], bool] | None = None
    check_every_tokens: int = 1

    def stops_at(self, step: int, running: torch.Tensor, num_tokens: torch.Tensor, rows: int) -> bool:
        """After decode step ``step`` (every engine loop's rule): whether ``stop``, asked every ``check_every_tokens``
        steps with which of the call's ``rows`` rows have ended (all but ``running``, long [b] of original rows), ends
        the call; if so the running rows keep their ``step + 1`` tokens (``num_tokens``, set in place)."""
        if self.stop is None or (step + 1) % self.check_every_tokens:
            return False
        ended = torch.ones(rows, dtype=torch.bool)
        ended[running.cpu()] = False  # waits for the device
        if not self.stop(ended.tolist()):
            return False
        num_tokens[running] = step + 1
        return True
