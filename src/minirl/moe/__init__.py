"""Routing Replay (R2/R3) for Hugging Face transformers MoE models; see ``replay.py`` for the contract."""

from .families import supported_families
from .metrics import route_bytes_per_1k_tokens, routing_agreement
from .replay import ROUTE_DTYPE, Recording, Replayed, RoutingReplay, UnsupportedModelError

__all__ = [
    "ROUTE_DTYPE",
    "Recording",
    "Replayed",
    "RoutingReplay",
    "UnsupportedModelError",
    "route_bytes_per_1k_tokens",
    "routing_agreement",
    "supported_families",
]
