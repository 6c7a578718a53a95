"""Routing Replay (R2/R3) for Hugging Face transformers MoE models; see ``replay.py`` for the contract."""

from .families import supported_families
from .replay import (
    ROUTE_DTYPE,
    Recording,
    Replayed,
    RoutePlan,
    RoutingReplay,
    UnsupportedModelError,
    route_bytes_per_1k_tokens,
)

__all__ = [
    "ROUTE_DTYPE",
    "Recording",
    "Replayed",
    "RoutePlan",
    "RoutingReplay",
    "UnsupportedModelError",
    "route_bytes_per_1k_tokens",
    "supported_families",
]
