"""A cold start that stops at a held-out accuracy target (``cold_start.until_accuracy``).

Fitting every teacher style to the same SFT *loss* starts RL from different accuracies (short answers
0.84, ~210-token traces 0.27-0.48 in the stress study), so response length and starting quality move
together. ``AccuracyTarget`` is a stopping rule for the SFT loop: every ``accuracy_every_steps`` steps
it loads the model's weights into a rollout engine, evaluates held-out accuracy exactly as RL does
(``minirl.loop.evaluate``: the engine's precision, ``eval.*`` settings), and says stop once the target
is reached. The loop's ``steps`` is the cap.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from minirl.config import Config, ConfigError


@dataclass
class AccuracyTarget:
    """Stop once ``evaluate(step)`` >= ``target``, asking every ``every_steps`` steps; ``history`` keeps
    (step, accuracy) of every evaluation."""

    target: float
    every_steps: int
    evaluate: Callable[[int], float]
    history: list[tuple[int, float]] = field(default_factory=list)

    def reached(self, step: int) -> bool:
        if step % self.every_steps:
            return False
        accuracy = self.evaluate(step)
        self.history.append((step, accuracy))
        return accuracy >= self.target

    def summary(self) -> dict[str, Any]:
        return {"until_accuracy": self.target, "accuracy_every_steps": self.every_steps,
                "accuracy_history": [[s, a] for s, a in self.history],
                "accuracy_reached": bool(self.history) and self.history[-1][1] >= self.target}


class EngineAccuracy:
    """``evaluate(step)`` for ``AccuracyTarget``: held-out accuracy of the model being fine-tuned, through a
    rollout engine built like RL's (a context manager: it owns the reward workers)."""

    def __init__(self, cfg: Config, model: Any, tokenizer: Any, task: Any) -> None:
        from minirl.runtime import build_engine, build_rewards

        self.cfg, self.model, self.task = cfg, model, task
        self.engine = build_engine(cfg, model, tokenizer)
        self._rewards_cm = build_rewards(cfg, task)
        self.rewards = self._rewards_cm.__enter__()

    def __call__(self, step: int) -> float:
        from minirl.loop import evaluate

        self.engine.load_weights({k: v.detach() for k, v in self.model.state_dict().items()})
        return evaluate(self.engine, self.rewards, self.task, self.cfg, step=step)["eval/accuracy"]

    def __enter__(self) -> EngineAccuracy:
        return self

    def __exit__(self, *exc: object) -> None:
        self._rewards_cm.__exit__(None, None, None)


def check_stopping_rule(cfg: Config) -> None:
    c = cfg.cold_start
    if c.until_accuracy is not None and c.until_loss is not None:
        raise ConfigError("cold_start.until_accuracy and cold_start.until_loss: set one stopping rule, not both")


def accuracy_target(cfg: Config, model: Any, tokenizer: Any, task: Any, stack: ExitStack) -> AccuracyTarget | None:
    """The SFT loop's accuracy stopping rule for ``cfg`` (its engine and reward workers entered on ``stack``),
    or None when ``cold_start.until_accuracy`` is not set."""
    check_stopping_rule(cfg)
    c = cfg.cold_start
    if c.until_accuracy is None:
        return None
    return AccuracyTarget(c.until_accuracy, c.accuracy_every_steps, stack.enter_context(EngineAccuracy(cfg, model, tokenizer, task)))
