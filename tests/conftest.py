"""Shared fixtures: tiny models built from configs (no downloads), one thread."""

from __future__ import annotations

import pytest
import torch

# Tiny models gain nothing from a second intra-op thread, and on a busy 2-core machine a second
# thread makes every small op wait for a descheduled worker: one thread per test process.
torch.set_num_threads(1)


def make_tiny_moe(seed: int = 0, vocab: int = 48, layers: int = 2):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=64,
        max_position_embeddings=128, norm_topk_prob=True, pad_token_id=0, eos_token_id=1, bos_token_id=None,
    )
    cfg._experts_implementation = "grouped_mm"
    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(cfg).float()


def ragged_batch(rows: int, seed: int = 0, *, completion_tokens=lambda i: 2 + (i * 5) % 4):
    """A collated batch of ``rows`` completions in groups of 2: prompts of 3-5 random tokens, row i's completion of
    ``completion_tokens(i)`` tokens, random rollout log-probs and advantages (pad id 0)."""
    from minirl.batching import collate
    from minirl.types import Completion

    g = torch.Generator().manual_seed(seed)
    comps = []
    for i in range(rows):
        prompt = torch.randint(2, 40, (3 + i % 3,), generator=g).tolist()
        completion = torch.randint(2, 40, (completion_tokens(i),), generator=g).tolist()
        comps.append(Completion(i // 2, i % 2, prompt, completion, -torch.rand(len(completion), generator=g), "eos"))
    return collate(comps, torch.randn(rows, generator=g), pad_token_id=0)


@pytest.fixture
def tiny_moe():
    return make_tiny_moe()


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one intra-op thread, and a busy shared 2-core machine does not
    stall them at every op (``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
