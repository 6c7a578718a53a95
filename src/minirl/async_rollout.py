"""``rollout.async_steps: k``: asynchronous RL, k steps off (k = 1: verl's ``one_step_off_policy``).

The rollout and rewards of step t+k run in a thread beside step t's old-log-prob pass and updates, on the
engine's weights before them (theta_{t-1}); step t+k then trains on that batch with pi_old = theta_{t+k-1}. Every
batch after the first k is k policy versions stale: mu_old and pi_old differ by k steps' updates as well as by the
engine's precision, and the objective's IS weight and clip mask see both (paper §3: "asynchronous frameworks, in
which a response can be produced by an older model version" is one source of policy staleness; R3 replays the
stale engine's routes). The first step samples in line, as verl's one-step-off trainer does, and starts steps
2..k+1 beside its update on the initial weights (their lags 1..k), as a bounded-staleness pipeline fills
(prime-rl's ``async_level``, AReaL's ``max_head_offpolicyness``, TRL's ``max_staleness`` as a fixed lag).

The thread touches only the engine, the reward source, the prompt order and (``rollout.partial_rollout``) the pool
of groups still decoding, which the main thread leaves alone
until ``wait``; the weight sync waits for it, so the engine never changes weights mid-rollout. What it samples
depends on nothing the update does (each step's sampling has its own seed, the engine its own copy of the
weights), so a threaded run is bitwise the run that samples step t+k in line before step t's update. A checkpoint
keeps the finished batches ahead (``state`` / ``load_state``), so a resumed run goes on bitwise.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable
from typing import Any

import torch

from minirl.dynamic_sampling import Sampled
from minirl.types import Batch, Completion, Prompt


class RolloutAhead:
    """The batches sampled ahead (``rollout.async_steps`` of them at most), each by step; the rollouts started beside
    an update run one after another in a daemon thread (a stopped run does not wait for it)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._results: dict[int, Sampled] = {}  # by the step each batch is for
        self._error: BaseException | None = None
        self._stopping = threading.Event()  # ``stop``: no further rollout starts

    @property
    def last_step(self) -> int:
        """The last step a finished batch is held for; 0 for none (read after ``take``, which waits for the thread)."""
        return max(self._results, default=0)

    def start(self, jobs: list[tuple[int, Callable[[], Sampled]]]) -> None:
        """Run each ``sample()`` (the rollout and rewards of its step) in order, in one thread."""
        assert self._thread is None, "the rollouts started beside the last update are still running"

        def body() -> None:
            for step, sample in jobs:
                if self._stopping.is_set():
                    return
                threading.current_thread().name = f"minirl-rollout-step-{step}"  # where a traceback or a profile says
                try:
                    self._results[step] = sample()
                except BaseException as exc:  # raised in the main thread by ``wait``
                    self._error = exc
                    return

        if jobs:
            self._thread = threading.Thread(target=body, daemon=True)
            self._thread.start()

    def wait(self) -> None:
        """Until the batches ahead are sampled (the engine is idle again); raises what a rollout or its rewards raised."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def take(self, step: int) -> Sampled | None:
        """The batch sampled ahead for ``step``, or None (none was: the run's first step, or the first after a resume
        of a run that ended there)."""
        self.wait()
        assert all(held >= step for held in self._results), f"batches ahead for steps {sorted(self._results)} at {step}"
        return self._results.pop(step, None)

    def stop(self) -> None:
        """Wait for the rollout still running, start no other, and drop what they gave (the run ends, or Ctrl-C: its
        engine and rewards close next)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        self._thread, self._results, self._error = None, {}, None
        self._stopping.clear()

    def state(self, prompts: list[Prompt]) -> dict[str, Any]:
        """The finished batches ahead in plain types and tensors (a checkpoint's ``weights_only`` state); their prompts
        as positions in ``prompts`` (the run's training prompts)."""
        self.wait()
        position = {id(prompt): n for n, prompt in enumerate(prompts)}
        return {"batches": [_plain(step, s, position) for step, s in sorted(self._results.items())]}

    def load_state(self, state: dict[str, Any], prompts: list[Prompt]) -> None:
        """Hold the batches ahead that a checkpoint's ``state()`` kept (one batch, as a one-step-off run's checkpoint
        kept it before ``async_steps`` could be more, is read too)."""
        assert self._thread is None
        batches = state.get("batches", [state] if state else [])
        self._results = {int(b["step"]): _sampled(b, prompts) for b in batches}


def _plain(step: int, s: Sampled, position: dict[int, int]) -> dict[str, Any]:
    return {"step": step, "prompts": [position[id(p)] for p in s.prompts],
            "completions": [dataclasses.asdict(dataclasses.replace(c, environment=None, environment_prompt=None))
                            for c in s.completions],  # scored already: the instance and its prompt are not needed
            "rewards": s.rewards,
            "reward_stats": dict(s.reward_stats), "columns": json.dumps(s.columns, default=str),
            "generated_tokens": s.generated_tokens, "reward_parts": s.reward_parts, "part_weights": s.part_weights,
            "greedy_rewards": s.greedy_rewards, "times": dict(s.times or {}), "policy_lag_steps": s.policy_lag_steps}


def _sampled(state: dict[str, Any], prompts: list[Prompt]) -> Sampled:
    return Sampled(
        prompts=[prompts[n] for n in state["prompts"]], completions=[Completion(**c) for c in state["completions"]],
        rewards=state["rewards"], reward_stats=dict(state["reward_stats"]), columns=json.loads(state["columns"]),
        generated_tokens=int(state["generated_tokens"]), reward_parts=state["reward_parts"],
        part_weights=state["part_weights"], times=dict(state["times"]), policy_lag_steps=state["policy_lag_steps"],
        greedy_rewards=state.get("greedy_rewards"))


def engine_weights(trainer: Any) -> Any:
    """``rollout.async_split_mismatch``'s copy of the weights the engine samples with: an ``EngineWeights`` beside a
    ``Trainer``; the ranks' own, behind a ``GroupEngineWeights``, for a trainer group."""
    from minirl.trainer import Trainer

    return EngineWeights(trainer) if isinstance(trainer, Trainer) else trainer.engine_weights()


class EngineWeights:
    """The trainer's trainable weights as the engine holds them (``rollout.async_split_mismatch``), to score a batch
    sampled ahead at the weights that sampled it: pi at theta_{t-1}, between mu_old (theta_{t-1}, the engine) and
    pi_old (theta_t), so that ``mismatch/*`` splits into the engine's own gap and the one-step lag.

    ``keep()`` copies the trainable parameters (with LoRA: the adapters; on an FSDP2 rank: its shards) before a
    step's updates, when they equal the engine's, whose rollout of the next step starts then; ``logprobs(batch)``
    at the next step swaps them in, scores, and puts the current weights back, which it keeps in their place.
    One more copy of the trainable weights in memory, and one more no-grad pass per step."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.kept: list[torch.Tensor] | None = None

    @property
    def ready(self) -> bool:
        """Whether weights were kept (not yet at a run's first step; a checkpoint keeps them, ``state_dict``)."""
        return self.kept is not None

    def _params(self) -> list[torch.Tensor]:
        from minirl.trainer import local_shard, reshard_all

        reshard_all(self.trainer.model)  # FSDP2 ranks: the shards (a forward leaves the root gathered)
        return [local_shard(p) for p in self.trainer.model.parameters() if p.requires_grad]

    @torch.no_grad()
    def keep(self) -> None:
        """The current trainable weights, which the engine has now."""
        params = self._params()
        if self.kept is None:
            self.kept = [p.detach().clone() for p in params]
        else:
            for kept, param in zip(self.kept, params, strict=True):
                kept.copy_(param)

    @torch.no_grad()
    def _swap(self) -> None:
        """The kept weights into the model's parameters, and the parameters' into ``kept``."""
        for kept, param in zip(self.kept or [], self._params(), strict=True):
            current = param.clone()
            param.copy_(kept)
            kept.copy_(current)

    @torch.no_grad()
    def logprobs(self, batch: Batch, *, replay_routes: bool = False) -> torch.Tensor:
        """log pi(y_t) of ``batch`` [B, T] at the kept weights (``Trainer.score``; 0 where ``batch.mask`` is False);
        the trainer's weights are the current ones again after, and kept."""
        if self.kept is None:
            raise RuntimeError("EngineWeights.logprobs before keep(): no weights of the engine's kept")
        self._swap()
        try:
            return self.trainer.score(batch, replay_routes=replay_routes, entropy=False).logp
        finally:
            for kept, param in zip(self.kept, self._params(), strict=True):  # the current weights back, still kept
                param.copy_(kept)

    def _trainable_names(self) -> list[str]:
        return [name for name, p in self.trainer.model.named_parameters() if p.requires_grad]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The kept weights by parameter name (a checkpoint's, so that the first step after a resume splits its
        mismatch too); empty before ``keep()``. On a trainer rank: the full weights, gathered from every rank's
        kept shards (a collective: every rank calls it; rank 0's is the whole)."""
        if self.kept is None:
            return {}
        from minirl.trainer import full_state

        self._swap()  # the kept weights in the model, gathered as its state is (copied before they swap back)
        try:
            full = full_state(self.trainer.model, self.trainer.collective)
            return {name: full[name].detach().cpu().clone() for name in self._trainable_names() if name in full}
        finally:
            self._swap()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Keep the weights a checkpoint's ``state_dict()`` holds (on a trainer rank: each its shards of them)."""
        if not state:
            return
        self.keep()  # the current weights, to be swapped out for the loaded ones
        missing = set(self._trainable_names()) - set(state)
        if missing:
            raise ValueError(f"the checkpoint's engine weights lack {sorted(missing)[:3]}")
        from minirl.trainer import load_full_state

        # the parameters then hold the loaded weights, ``kept`` the current ones
        load_full_state(self.trainer.model, state, self.trainer.collective, strict=False)
        self._swap()
