"""The ``RolloutEngine`` protocol."""

from __future__ import annotations

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
