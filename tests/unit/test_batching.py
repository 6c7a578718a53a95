"""Layout of completions for the trainer: targets, masks and routes line up."""

from __future__ import annotations

import torch

from minirl.batching import collate, micro_batches, split, trim
from minirl.types import Completion


def _completion(i, prompt, completion, routes=False):
    r = None
    if routes:
        n = len(prompt) + len(completion)
        r = torch.arange(n * 2 * 2, dtype=torch.int16).view(n, 2, 2) % 4
        r[-1] = -1
    return Completion(i, 0, prompt, completion, torch.tensor([-0.1 * (k + 1) for k in range(len(completion))]), "eos", routes=r)


def test_collate_aligns_targets_with_completion_tokens():
    batch = collate([_completion(0, [5, 6], [7, 8, 9]), _completion(1, [5], [4])], torch.tensor([1.0, -1.0]), pad_token_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 4, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[True] * 5, [True, True, False, False, False]]
    # target t predicts input_ids[t+1]: completion tokens 7,8,9 are targets 1,2,3
    assert batch.mask.tolist() == [[False, True, True, True], [True, False, False, False]]
    assert torch.allclose(batch.logp_rollout[0], torch.tensor([0.0, -0.1, -0.2, -0.3]))
    assert torch.allclose(batch.logp_rollout[1], torch.tensor([-0.1, 0.0, 0.0, 0.0]))
    assert batch.group_ids.tolist() == [0, 1]


def test_routes_are_padded_with_minus_one_and_trimmed():
    batch = collate([_completion(0, [5, 6], [7, 8], routes=True), _completion(1, [5], [4], routes=True)], torch.zeros(2), 0)
    assert batch.routes.shape == (2, 4, 2, 2)
    assert (batch.routes[1, 2:] == -1).all() and (batch.routes[0, 3] == -1).all()
    small = trim(batch.select(slice(1, 2)))
    assert small.input_ids.shape == (1, 2) and small.routes.shape == (1, 2, 2, 2) and small.mask.shape == (1, 1)


def test_split_and_micro_batches_cover_every_row_once():
    comps = [_completion(i, [1], [2] * (i + 1)) for i in range(6)]
    batch = collate(comps, torch.arange(6.0), 0)
    parts = split(batch, 3)
    assert [p.advantages.tolist() for p in parts] == [[0, 1], [2, 3], [4, 5]]
    rows, micro = zip(*micro_batches(batch, 4))
    assert rows == (slice(0, 4), slice(4, 6)) and [m.size for m in micro] == [4, 2]
    assert micro[0].input_ids.shape[1] == 5 and micro[1].input_ids.shape[1] == 7  # each trimmed to its longest row
    budget = micro_batches(batch, 4, max_tokens=16, padded=False)  # lengths 2..7, longest first: 7+6 | 5+4+3+2
    assert [index.tolist() for index, _ in budget] == [[4, 5], [0, 1, 2, 3]]


def test_token_budget_rows_hand_computed():
    from minirl.batching import token_budget_rows

    # lengths 5, 2, 9, 3, 9, 4 -> longest first: rows 2 (9), 4 (9), 0 (5), 5 (4), 3 (3), 1 (2)
    lengths = [5, 2, 9, 3, 9, 4]
    # budget 18: [2, 4] pads to 2 x 9 = 18; then 0, 5, 3 at width 5 (3 x 5 = 15), then 1 would make 4 x 5 = 20
    assert token_budget_rows(lengths, max_sequences=8, max_tokens=18) == [[2, 4], [0, 3, 5], [1]]
    # a row over the budget goes alone; the row cap cuts too
    assert token_budget_rows(lengths, max_sequences=2, max_tokens=8) == [[2], [4], [0], [3, 5], [1]]
    assert token_budget_rows([], max_sequences=4, max_tokens=10) == []


def test_token_budget_rows_cut_further_to_the_count_another_fsdp_rank_needs():
    from minirl.batching import token_budget_rows

    lengths = [5, 2, 9, 3, 9, 4]  # budget 18 alone: [[2, 4], [0, 3, 5], [1]] (above)
    # 4: the micro-batch with the most rows ([0, 3, 5]) halved, its longer rows first: 0 (5), 5 (4) | 3 (3)
    assert token_budget_rows(lengths, max_sequences=8, max_tokens=18, at_least=4) == [[2, 4], [0, 5], [3], [1]]
    # 5: then the first of those with two rows, [2, 4], into [2] | [4]
    assert token_budget_rows(lengths, max_sequences=8, max_tokens=18, at_least=5) == [[2], [4], [0, 5], [3], [1]]
    assert len(token_budget_rows(lengths, max_sequences=8, max_tokens=18, at_least=9)) == 6  # one row each at most
    assert token_budget_rows(lengths, max_sequences=8, max_tokens=18, at_least=2) == [[2, 4], [0, 3, 5], [1]]


def test_token_budget_chunks_cover_every_row_once_within_the_budget():
    from minirl.batching import token_budget_chunks

    g = torch.Generator().manual_seed(0)
    comps = [_completion(i, [1] * int(torch.randint(1, 6, (1,), generator=g)), [2] * int(torch.randint(1, 12, (1,), generator=g)))
             for i in range(20)]
    batch = collate(comps, torch.arange(20.0), pad_token_id=0)
    padded_fixed = batch.input_ids.numel()
    seen, padded = [], 0
    for rows, micro in token_budget_chunks(batch, max_sequences=6, max_tokens=40):
        seen += rows.tolist()
        assert micro.size <= 6 and (micro.input_ids.numel() <= 40 or micro.size == 1)
        assert torch.equal(micro.input_ids, trim(batch.select(rows)).input_ids)
        assert torch.equal(micro.advantages, batch.advantages[rows])
        padded += micro.input_ids.numel()
    assert sorted(seen) == list(range(20))
    assert padded < padded_fixed  # the point: less padding than one right-padded batch


def test_mask_truncated_leaves_completions_cut_by_the_length_limit_out_of_the_loss():
    """TRL's ``mask_truncated_completions``: a completion that hit ``max_new_tokens`` trains no token; the batch
    keeps it (its advantage, its logp_rollout, its row) so the group's baseline and every layout are unchanged."""
    cut = Completion(1, 1, [5], [4, 3], torch.tensor([-0.5, -0.6]), "length")
    done = [_completion(0, [5, 6], [7, 8, 9]), cut]
    plain = collate(done, torch.tensor([1.0, -1.0]), pad_token_id=0)
    masked = collate(done, torch.tensor([1.0, -1.0]), pad_token_id=0, mask_truncated=True)
    assert plain.mask.tolist() == [[False, True, True, True], [True, True, False, False]]
    assert masked.mask.tolist() == [[False, True, True, True], [False, False, False, False]]
    assert torch.equal(masked.logp_rollout, plain.logp_rollout) and torch.equal(masked.input_ids, plain.input_ids)
    assert torch.equal(masked.advantages, plain.advantages)
