"""Shared data types and the glossary of dimensions.

Dimensions used in names throughout minirl:
    P  number of prompts in a global step (``prompts_per_step``)
    G  samples per prompt (``samples_per_prompt``), the group size of the baseline
    B  number of sequences in a (mini-)batch; B = P * G for a global batch
    S  sequence positions fed to the model (prompt + completion, right-padded)
    T  target positions, S - 1: position t predicts token ``input_ids[:, t + 1]``
    L  number of MoE layers, in model order
    K  experts per token (top-k)

Log-probability names say where a number came from:
    ``logp_rollout``  log mu_old(y_t): the rollout engine, at sampling time (distribution actually sampled)
    ``logp_old``      log pi_old(y_t): the trainer at theta_old, no gradient
    ``logp``          log pi_theta(y_t): the trainer, with gradient

Masks are positive: ``True`` means "this token is trained on / counted".
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch

FinishReason = Literal["eos", "length"]


@dataclass
class SamplingParams:
    """How the rollout engine samples. ``logp_rollout`` is of the repetition-penalised, tempered, min-p / top-k /
    top-p-truncated law (``top_k`` 0, ``min_p`` 0 and ``repetition_penalty`` 1: off; ``minirl.rollout.sampling``)."""

    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0


@dataclass
class Prompt:
    """One task instance: what the model sees, and what the verifier needs.

    ``messages``: a conversational prompt (``[{"role": "user", "content": ...}, ...]``), rendered
    with the tokenizer's chat template (``minirl.tasks.chat.encode_prompt``); ``text`` is then its
    plain-text form (the contents, one per line). ``meta``: the data row's other columns (and
    ``source``, where it came from), passed to reward functions as keywords.
    """

    text: str
    answer: str
    uid: str = ""
    meta: dict = field(default_factory=dict)
    messages: list[dict] | None = None
    response_prefix: list[int] | None = None
    """Partial rollouts (``minirl.partial_rollout``): the token ids of a response to this prompt begun in an earlier
    step; an engine feeds them after the prompt's own tokens and continues it (``Completion.prompt_ids`` then end
    with them). None: a new response."""


@dataclass
class Completion:
    """One sampled response, as returned by a ``RolloutEngine``.

    ``routes`` (only when the engine was asked to record routing, for R3): integer tensor
    [S_i, L, K] aligned with the positions the trainer feeds (prompt tokens then completion
    tokens). The final sampled token is never fed through the model while sampling, so its row
    is -1 (natural routing on replay).
    """

    prompt_index: int  # index into the list of prompts passed to ``generate``
    sample_index: int  # 0..G-1 within its group
    prompt_ids: list[int]
    completion_ids: list[int]
    logp_rollout: torch.Tensor  # float32 [len(completion_ids)]
    finish_reason: FinishReason
    text: str = ""  # decoded completion (without special tokens)
    routes: torch.Tensor | None = None  # int16 [len(prompt_ids) + len(completion_ids), L, K]
    sampled_at_steps: torch.Tensor | None = None  # int32 [len(completion_ids)]: the global step whose engine weights
    # sampled each token (``rollout.partial_rollout``; None: all of them the step's own)
    sampled_mask: torch.Tensor | None = None  # bool [len(completion_ids)]: True where the engine sampled the token, False
    # where a tool's result was inserted (``task.tools``, ``minirl.rollout.tools``; TRL's ``tool_mask``); None: all sampled
    messages: list[dict[str, Any]] | None = None  # ``task.tools``: the completion as chat messages (assistant turns
    # with their parsed ``tool_calls``, the ``tool`` results), what TRL hands reward functions as ``completions``
    tool_calls: int = 0  # ``task.tools``: calls the model wrote in this response (run or not)
    tool_failures: int = 0  # ``task.tools``: of those, calls that failed (malformed, unknown tool, raised)
    environment_reward: float | None = None  # ``task.environment``: its ``get_reward()`` once the response ended
    environment_prompt: Any = None  # ``task.environment``: the ``Prompt`` its ``reset()`` added text to, what the reward
    # functions are shown (TRL's ``prompts``); None: the row's own
    tool_extra_fields: dict[str, Any] | None = None  # ``task.tool_config``: verl's ``tool_extra_fields`` (the tools'
    # ``extra_fields``, ``turn_scores``, ``tool_rewards``), for reward functions' ``extra_info``
    environment: Any = field(default=None, repr=False, compare=False)  # ``task.environment``: the rollout's instance,
    # held for reward functions taking ``environments`` (TRL's); never saved (a dump, a checkpoint drop it)


@dataclass(frozen=True)
class Batch:
    """A (mini-)batch laid out for the trainer; built by ``minirl.batching.collate``. Immutable:
    a step's later stages get a new batch (``with_logp_old``, ``with_routes``), never an edit.

    input_ids       long [B, S]  prompt + completion, right-padded with the pad id
    attention_mask  bool [B, S]
    mask            bool [B, T]  True where the target ``input_ids[:, t+1]`` is a completion token
    logp_rollout    float [B, T] mu_old of each target token (0 where mask is False)
    advantages      float [B], or [B, T] with ``algo.adv_token_returns`` (0 where mask is False)
    group_ids       long [B]     which prompt each row belongs to
    routes          int [B, S, L, K] or None  routing to replay (-1 = natural)
    logp_old        float [B, T] or None, filled by the old-log-prob pass
    logp_ref        float [B, T] or None, the frozen reference's (``algo.kl_coef`` > 0 only)
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    mask: torch.Tensor
    logp_rollout: torch.Tensor
    advantages: torch.Tensor
    group_ids: torch.Tensor
    routes: torch.Tensor | None = None
    logp_old: torch.Tensor | None = None
    logp_ref: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def with_logp_old(self, logp_old: torch.Tensor) -> Batch:
        """This batch with pi_old's log-probs [B, T] (the old-log-prob pass's result)."""
        return replace(self, logp_old=logp_old)

    def with_mask(self, mask: torch.Tensor) -> Batch:
        """This batch training only the target positions of ``mask`` [B, T] (a subset: ``algo.reject``)."""
        return replace(self, mask=mask)

    def with_logp_ref(self, logp_ref: torch.Tensor) -> Batch:
        """This batch with the reference policy's log-probs (the KL penalty, ``minirl.reference``)."""
        return replace(self, logp_ref=logp_ref)

    def with_routes(self, routes: torch.Tensor | None) -> Batch:
        """This batch with the routes [B, S, L, K] its forwards replay (None: natural routing)."""
        return replace(self, routes=routes)

    def to(self, device: torch.device | str) -> Batch:
        """Every tensor field on ``device`` (the batch itself when already there)."""
        if self.input_ids.device == torch.device(device):
            return self

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else to_device(t, device)

        moved: dict[str, Any] = {name: move(getattr(self, name)) for name in self.__dataclass_fields__}
        return Batch(**moved)

    def select(self, index: torch.Tensor | slice) -> Batch:
        """Rows ``index`` of every tensor field (a mini-batch or micro-batch view)."""

        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[index]

        return Batch(
            input_ids=self.input_ids[index],
            attention_mask=self.attention_mask[index],
            mask=self.mask[index],
            logp_rollout=self.logp_rollout[index],
            advantages=self.advantages[index],
            group_ids=self.group_ids[index],
            routes=pick(self.routes),
            logp_old=pick(self.logp_old),
            logp_ref=pick(self.logp_ref),
        )


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device``; host to CUDA through pinned memory without blocking (a plain copy from pageable
    memory makes the host wait for the GPU's queue), so feeding a micro-batch never stalls the launches."""
    if t.device.type == "cpu" and torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
