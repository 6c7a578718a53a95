"""minirl: stable reinforcement learning for language models (MiniRL + Routing Replay)."""

__version__ = "0.1.0"
