"""Rollout engines: the ``RolloutEngine`` protocol and minirl's built-in ``NativeEngine``."""

from minirl.rollout.base import RolloutEngine
from minirl.rollout.native import NativeEngine

__all__ = ["NativeEngine", "RolloutEngine"]
