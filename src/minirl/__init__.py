"""minirl: stable reinforcement learning for language models (MiniRL + Routing Replay)."""

__version__ = "0.1.0"


def __getattr__(name: str):  # ``minirl.train`` without importing torch at ``import minirl``
    if name == "train":
        from minirl.api import train

        return train
    raise AttributeError(f"module 'minirl' has no attribute {name!r}")
