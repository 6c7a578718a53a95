"""``RoutingReplay.replay(capture_natural=True)``: the routers' own top-k, captured under replay.

The default path (no capture) must stay bitwise what it was; the capture must report what each
router would have picked on the hidden states it actually received.
"""

from __future__ import annotations

import pytest
import torch

from minirl.moe import RoutingReplay
from tests.conftest import make_tiny_moe


def _setup(layers: int = 3):
    model = make_tiny_moe(layers=layers)
    replay = RoutingReplay(model)
    x = torch.randint(2, 40, (3, 9), generator=torch.Generator().manual_seed(0))
    with replay.record() as rec, torch.no_grad():
        model(input_ids=x)
    return model, replay, x, rec.routes


def _other_experts(routes: torch.Tensor, num_experts: int) -> torch.Tensor:
    """A valid routing that differs from ``routes`` everywhere (shift every expert id by one)."""
    return ((routes.long() + 1) % num_experts).to(routes.dtype)


def _forward_backward(model, replay, x, routes, **kwargs):
    model.zero_grad(set_to_none=True)
    with replay.replay(routes, **kwargs) as handle:
        logits = model(input_ids=x).logits
        logits.float().square().mean().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads, handle


def test_capture_changes_nothing_and_default_captures_nothing():
    model, replay, x, routes = _setup()
    forced = _other_experts(routes, replay.num_experts)
    forced[:, -2:] = -1  # some natural rows too
    plain_logits, plain_grads, plain = _forward_backward(model, replay, x, forced)
    cap_logits, cap_grads, captured = _forward_backward(model, replay, x, forced, capture_natural=True)
    assert plain.natural_routes is None
    assert torch.equal(plain_logits, cap_logits)
    assert plain_grads.keys() == cap_grads.keys() and all(torch.equal(plain_grads[k], cap_grads[k]) for k in plain_grads)
    nat = captured.natural_routes
    assert nat.dtype == torch.int16 and nat.shape == routes.shape and bool((nat >= 0).all())


def test_natural_of_a_fresh_recording_is_the_recording():
    model, replay, x, routes = _setup()
    with replay.replay(routes, capture_natural=True) as handle, torch.no_grad():
        model(input_ids=x)
    assert torch.equal(handle.natural_routes, routes)


def test_natural_at_layer_l_depends_only_on_the_routing_of_earlier_layers():
    model, replay, x, routes = _setup(layers=3)
    shifted = _other_experts(routes, replay.num_experts)

    def natural(r):
        with replay.replay(r, capture_natural=True) as handle, torch.no_grad():
            model(input_ids=x)
        return handle.natural_routes

    # forcing every layer: layer 0 sees the untouched embeddings, so its natural choice is the recording's
    all_forced = natural(shifted)
    assert torch.equal(all_forced[:, :, 0], routes[:, :, 0])
    assert not torch.equal(all_forced, routes)  # later layers see other hidden states
    # layers 0..l-1 forced, layers l.. natural (-1): the natural choice at layer l is the one actually used,
    # and forcing layers >= l on top of that must not change it
    for layer in range(1, replay.num_layers):
        prefix = shifted.clone()
        prefix[:, :, layer:] = -1
        used = natural(prefix)
        assert torch.equal(used[:, :, layer], all_forced[:, :, layer]), layer


def test_capture_under_gradient_checkpointing_counts_one_forward():
    model, replay, x, routes = _setup()
    model.gradient_checkpointing_enable()
    model.train()
    forced = _other_experts(routes, replay.num_experts)
    _, _, plain = _forward_backward(model, replay, x, forced)
    _, _, captured = _forward_backward(model, replay, x, forced, capture_natural=True)
    assert plain.natural_routes is None
    with replay.replay(forced, capture_natural=True) as handle, torch.no_grad():
        model.eval()(input_ids=x)
    assert torch.equal(captured.natural_routes, handle.natural_routes)


def test_failed_block_leaves_no_capture():
    _model, replay, _x, routes = _setup()
    with pytest.raises(ValueError, match="layer 0 consumed its routes 0 times"):
        with replay.replay(routes, capture_natural=True) as handle:
            pass
    assert handle.natural_routes is None
