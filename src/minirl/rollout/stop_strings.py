"""Stop strings inside the decode loop: a response that has written one leaves the batch at that step, as one that
drew a stop token does (vLLM's and HF ``generate``'s ``stop_strings``), instead of decoding on to ``max_new_tokens``
and being cut after the call.

Each step only the rows whose new token could end a stop string are looked at: a token whose text holds the last
character of one (a [vocabulary] mask made once, on the engine's device). For each, the last few tokens are decoded
(enough for the longest stop string even at 4 byte-tokens a character) and, on a hit, the whole response so far, so
that a row stops exactly where ``minirl.tasks.chat.cut_at_stop_strings`` would cut it. A stop the mask cannot see
(a character split over byte tokens) is still cut after the call: this only saves decoding, it never changes which
tokens a response keeps. (The CUDA-graph decode, ``rollout.cuda_graphs``, still cuts after the call: its steps
never wait for the host.) With one sampling stream per row (``cluster.sample_seeding: per_sample``) every response is
the one the engine gave before; with one stream for the batch the rows that stay draw from it in another order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class StopStrings:
    """The rows of a decode step that have just completed a stop string (module docstring)."""

    def __init__(self, tokenizer: Any, stops: Sequence[str], vocab_size: int, device: torch.device) -> None:
        self.tokenizer, self.stops = tokenizer, tuple(stops)
        self.window = 4 * max(len(stop.encode("utf-8")) for stop in self.stops) + 4
        last = {stop[-1] for stop in self.stops}
        size = max(vocab_size, len(tokenizer))
        texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=True)
        can_end = [any(char in text for char in last) for text in texts] + [False] * (size - len(texts))
        self.can_end = torch.tensor(can_end, dtype=torch.bool, device=device)

    def hit(self, tokens_BN: torch.Tensor, rows: torch.Tensor, step: int, new: torch.Tensor) -> torch.Tensor:
        """bool [len(rows)]: which running rows' responses (``tokens_BN[rows, :step + 1]``, the new token ``new``
        included) now hold a stop string."""
        found = torch.zeros_like(new, dtype=torch.bool)
        candidates = self.can_end[new].nonzero().squeeze(-1).tolist()
        if not candidates:
            return found
        start = max(0, step + 1 - self.window)
        for i in candidates:
            row = int(rows[i])
            tail = self.tokenizer.decode(tokens_BN[row, start: step + 1].tolist(), skip_special_tokens=True)
            if any(stop in tail for stop in self.stops):
                whole = self.tokenizer.decode(tokens_BN[row, : step + 1].tolist(), skip_special_tokens=True)
                found[i] = any(stop in whole for stop in self.stops)
        return found
