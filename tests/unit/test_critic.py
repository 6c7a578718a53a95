"""PPO with a learned critic (``algo.adv_baseline: critic``; verl's ``gae``): GAE and the clipped value loss by hand and
against verl's loops written out, the critic's values and updates, and the loop: the policy's advantages are the
whitened GAE of the critic's values, the critic trains first, ``critic.warmup_steps`` holds the policy back."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from minirl.algo.variants.gae import gae_advantages, value_loss
from minirl.algo.variants.token_returns import masked_whiten
from minirl.config import ConfigError, load_config
from tests.distributed.common import ROOT, run_steps


def test_gae_by_hand():
    """gamma 0.9, lambda 0.8; row 2 ends after two tokens (its third position is padding)."""
    values = torch.tensor([[0.5, 0.2, 0.1], [0.3, 0.4, 9.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    advantages, returns = gae_advantages(torch.tensor([1.0, -1.0]), values, mask, gamma=0.9, lam=0.8)
    # row 1: delta = (0.9, 0.09 - 0.2, 0.18 - 0.5); A_t = delta_t + 0.72 A_t+1
    a1 = [-0.32 + 0.72 * (-0.11 + 0.72 * 0.9), -0.11 + 0.72 * 0.9, 0.9]
    # row 2: the last trained token's next value is 0: delta = (0.36 - 0.3, -1 - 0.4)
    a2 = [0.06 + 0.72 * -1.4, -1.4, 0.0]
    torch.testing.assert_close(advantages, torch.tensor([a1, a2]), rtol=0, atol=1e-6)
    torch.testing.assert_close(returns, torch.tensor([[a + v for a, v in zip(a1, [0.5, 0.2, 0.1])],
                                                      [a2[0] + 0.3, a2[1] + 0.4, 0.0]]), rtol=0, atol=1e-6)
    # lambda = gamma = 1: A_t = R - V_t, the return less the value
    advantages, returns = gae_advantages(torch.tensor([1.0, -1.0]), values, mask)
    torch.testing.assert_close(advantages, torch.tensor([[0.5, 0.8, 0.9], [-1.3, -1.4, 0.0]]), rtol=0, atol=1e-6)
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]]), rtol=0, atol=1e-6)


def _verl_gae(token_level_rewards, values, response_mask, gamma, lam):
    """verl's ``compute_gae_advantage_return`` (core_algos.py), written out."""
    nextvalues, lastgaelam, advantages_reversed = 0, 0, []
    for t in reversed(range(token_level_rewards.shape[-1])):
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    return advantages, advantages + values


def test_the_same_advantages_and_returns_as_verls_gae():
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 1, 7, 3])
    mask = torch.arange(7)[None, :] < lengths[:, None]
    values = torch.randn(4, 7, generator=g) * mask  # verl's values are 0 off the response (its critic masks them)
    rewards = torch.randn(4, generator=g)
    kl = torch.randn(4, 7, generator=g).abs() * mask
    token_level = -0.1 * kl
    token_level[torch.arange(4), lengths - 1] += rewards  # the score at the last response token
    want_a, want_g = _verl_gae(token_level, values, mask.float(), 0.99, 0.95)
    got_a, got_g = gae_advantages(rewards, values, mask, gamma=0.99, lam=0.95, token_rewards_BT=-0.1 * kl)
    torch.testing.assert_close(got_a, want_a * mask, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_g, want_g * mask, rtol=0, atol=1e-6)
    torch.testing.assert_close(masked_whiten(got_a, mask), masked_whiten(want_a, mask), rtol=0, atol=1e-5)


def test_the_clipped_value_loss_by_hand():
    """Token 1 unclipped ((1.0 - 0.5)^2 = 0.25 beats the clipped 0.04); token 2's value moved 1.0 from V_old, past the
    range 0.5: the clipped error (0.5 - 0.2)^2 = 0.09 beats 0.04, and no gradient flows through it."""
    values = torch.tensor([[1.0, 0.0]], requires_grad=True)
    old, returns, mask = torch.tensor([[0.2, 1.0]]), torch.tensor([[0.5, 0.2]]), torch.tensor([[True, True]])
    loss, metrics = value_loss(values, old, returns, mask, clip_range=0.5, normalizer=2.0)
    assert float(loss.detach()) == pytest.approx(0.5 * (0.25 + 0.09) / 2, abs=1e-7)
    assert float(metrics["vf_clipfrac"]) == 0.5 and float(metrics["vpred_mean"]) == 0.5
    (grad,) = torch.autograd.grad(loss, values)
    torch.testing.assert_close(grad, torch.tensor([[0.5 * 2 * (1.0 - 0.5) / 2, 0.0]]), rtol=0, atol=1e-7)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean", "seq_sum", "seq_sum_norm"])
def test_the_value_loss_averages_as_verls_aggregations(aggregation):
    """``critic.loss_aggregation``: verl's token-mean, seq-mean-token-mean, seq-mean-token-sum and
    seq-mean-token-sum-norm (its horizon the response budget, 40 tokens) of 1/2 (V - G)^2 (V = V_old: nothing clipped),
    over micro-batches of 2 rows of a mini-batch of 6 with responses of several lengths."""
    from tests.unit.test_trainer_precision import batch_of

    critic, _ = _critic(loss_aggregation=aggregation)
    critic.micro_batch_sequences = 2
    assert critic.horizon_tokens == load_config(None, []).rollout.max_new_tokens
    critic.horizon_tokens = 40
    batch = batch_of(6)
    values = critic.values(batch)
    returns = torch.where(batch.mask, 0.3, 0.0)
    squared = 0.5 * (values - returns).square() * batch.mask
    tokens = batch.mask.sum(dim=1)
    assert len(set(tokens.tolist())) > 1  # responses of several lengths: the three differ
    want = {"token_mean": squared.sum() / tokens.sum(), "seq_sum": squared.sum(dim=1).mean(),
            "seq_sum_norm": squared.sum(dim=1).sum() / (6 * 40),
            "seq_mean": (squared.sum(dim=1) / tokens).mean()}[aggregation]
    assert critic.update(batch, values, returns)["vf_loss"] == pytest.approx(float(want), rel=1e-5)


def _critic(seed=0, preset="qwen3-moe-tiny", **kwargs):
    from minirl.critic import build_critic
    from minirl.runtime import build_model

    cfg = load_config(None, [f"model.preset={preset}", f"run.seed={seed}"])
    policy, _ = build_model(cfg)
    return build_critic(cfg.model_copy(update={"critic": cfg.critic.model_copy(update=kwargs)}), policy), policy


def test_the_critic_starts_from_the_policy_and_draws_its_head_from_its_own_stream():
    before = torch.random.get_rng_state()
    critic, policy = _critic()
    assert torch.equal(before, torch.random.get_rng_state())  # the run's stream is untouched
    for (name, p), q in zip(policy.base_model.state_dict().items(), critic.model.base_model.state_dict().values()):
        assert torch.equal(p, q), name
    again, _ = _critic()
    assert torch.equal(critic.model.score.weight, again.model.score.weight)  # seeded: the same head each time


def test_an_architecture_without_a_token_classification_class_gets_a_linear_value_head(tmp_path):
    """OLMoE has no transformers TokenClassification class: its AutoModel under a linear head (``ValueModel``), from
    the policy's weights or from ``critic.model_path`` (a saved HF model directory); both give one value per position
    and train."""
    from minirl.critic import ValueModel
    from tests.unit.test_trainer_precision import batch_of

    critic, policy = _critic(preset="olmoe-tiny", lr=1e-2)
    assert isinstance(critic.model, ValueModel)
    for (name, p), q in zip(policy.base_model.state_dict().items(), critic.model.base_model.state_dict().values()):
        assert torch.equal(p, q), name
    batch = batch_of(4)
    before = critic.values(batch)
    assert before.shape == batch.mask.shape and bool(before[batch.mask].ne(0).all())
    critic.update(batch, before, torch.where(batch.mask, 1.0, 0.0))
    assert not torch.equal(critic.values(batch), before)
    policy.save_pretrained(tmp_path / "olmoe")
    loaded, _ = _critic(preset="olmoe-tiny", model_path=str(tmp_path / "olmoe"))
    assert isinstance(loaded.model, ValueModel)
    for (name, p), q in zip(policy.base_model.state_dict().items(), loaded.model.base_model.state_dict().values()):
        assert torch.equal(p, q), name
    with pytest.raises(ConfigError, match=r"^critic.model_path: .*nowhere is not a Hugging Face model directory"):
        _critic(model_path=str(tmp_path / "nowhere"))
    _, policy = _critic()
    policy.save_pretrained(tmp_path / "qwen")
    loaded, _ = _critic(model_path=str(tmp_path / "qwen"))  # a TokenClassification model, the head new
    assert type(loaded.model).__name__ == "Qwen3MoeForTokenClassification"
    for (name, p), q in zip(policy.base_model.state_dict().items(), loaded.model.base_model.state_dict().values()):
        assert torch.equal(p, q), name


def test_a_lora_critic_trains_its_adapters_and_its_head_only():
    """``critic.lora`` (verl's ``critic.model.lora_rank``): adapters on the transformer (``all-linear``: not the value
    head), the head trainable, every other weight frozen through an update."""
    from minirl.config import LoRAConfig
    from tests.unit.test_trainer_precision import batch_of

    critic, _ = _critic(lr=1e-2, lora=LoRAConfig(rank=2, target_modules=["all-linear"]))
    trainable = {name for name, p in critic.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name or name.startswith("score.") for name in trainable), trainable
    assert {"score.weight"} <= trainable and not any(name.startswith("score.lora") for name in trainable)
    before = {name: p.detach().clone() for name, p in critic.model.named_parameters()}
    batch = batch_of(4)
    critic.update(batch, critic.values(batch), torch.where(batch.mask, 1.0, 0.0))
    changed = {name for name, p in critic.model.named_parameters() if not torch.equal(p, before[name])}
    assert changed and changed <= trainable and "score.weight" in changed


def test_values_sit_before_each_target_token_whatever_the_micro_batches():
    from tests.unit.test_trainer_precision import batch_of

    critic, _ = _critic()
    batch = batch_of(6)
    values = critic.values(batch)
    with torch.no_grad():
        direct = critic.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits[:, :-1, 0]
    torch.testing.assert_close(values, direct * batch.mask, rtol=0, atol=1e-6)
    critic.micro_batch_sequences = 2
    torch.testing.assert_close(critic.values(batch), values, rtol=0, atol=1e-6)
    critic.micro_batch_sequences, critic.micro_batch_max_tokens = 64, 2 * int(batch.attention_mask.sum(1).max())
    torch.testing.assert_close(critic.values(batch), values, rtol=0, atol=1e-6)  # the token budget's micro-batches
    returns = torch.where(batch.mask, 1.0, 0.0)
    budget = critic.update(batch, values, returns)
    whole, _ = _critic()
    assert whole.update(batch, values, returns)["vf_loss"] == pytest.approx(budget["vf_loss"], rel=1e-5)
    torch.testing.assert_close(whole.values(batch), critic.values(batch), rtol=0, atol=1e-5)


@pytest.mark.parametrize("preset", ["qwen3-moe-tiny", "olmoe-tiny"])  # a TokenClassification model; ValueModel
def test_padding_free_and_shared_prompt_critics_are_the_padded_one(preset):
    """``optim.padding_free`` / ``optim.shared_prompt`` reach the critic (verl's ``critic.model.use_remove_padding``):
    its forwards run on the real tokens, each prompt of a micro-batch once, and its values and its update are the
    padded critic's to float rounding, with a token budget too."""
    from minirl.critic import build_critic
    from minirl.runtime import build_model
    from tests.unit.test_shared_prompt import grouped_batch

    critics = {}
    for arm, flags in {"padded": [], "padding_free": ["optim.padding_free=true"],
                       "shared_prompt": ["optim.shared_prompt=true"]}.items():
        cfg = load_config(None, [f"model.preset={preset}", "critic.lr=1e-2", *flags])
        policy, _ = build_model(cfg)
        critics[arm] = build_critic(cfg, policy)
    packed = {arm: critic._packed for arm, critic in critics.items()}  # the padding-free forward each was given
    assert (packed["padded"], packed["padding_free"].shared_prompt, packed["shared_prompt"].shared_prompt) == (None, False, True)
    batch = grouped_batch()  # 3 prompts x 4 completions
    fed: dict[str, list[int]] = {arm: [] for arm in critics}
    for arm, critic in critics.items():
        critic.model.base_model.get_input_embeddings().register_forward_hook(
            lambda m, args, out, arm=arm: fed[arm].append(args[0].numel()))
    values = {arm: critic.values(batch) for arm, critic in critics.items()}
    real = int(batch.attention_mask.sum())
    assert fed == {"padded": [batch.input_ids.numel()], "padding_free": [real], "shared_prompt": [real - 3 * (3 + 4 + 5)]}
    for arm in critics:
        torch.testing.assert_close(values[arm], values["padded"], rtol=0, atol=1e-6)
    returns = torch.where(batch.mask, torch.linspace(-1, 1, batch.mask.shape[1]).expand_as(batch.mask), 0.0)
    critics["shared_prompt"].micro_batch_max_tokens = 40  # a token budget that counts each prompt once
    metrics = {arm: critic.update(batch, values["padded"], returns) for arm, critic in critics.items()}
    assert len(fed["shared_prompt"]) > 2  # the budget's micro-batches
    for arm in critics:
        assert metrics[arm]["vf_loss"] == pytest.approx(metrics["padded"]["vf_loss"], rel=1e-5, abs=1e-7)
        assert metrics[arm]["grad_norm"] == pytest.approx(metrics["padded"]["grad_norm"], rel=1e-4)
        torch.testing.assert_close(critic_values := critics[arm].values(batch), critics["padded"].values(batch),
                                   rtol=0, atol=1e-5)
        assert critic_values.shape == batch.mask.shape


def test_the_critic_regresses_on_the_returns():
    from tests.unit.test_trainer_precision import batch_of

    critic, _ = _critic(lr=1e-2, clip_value_range=10.0, lr_warmup_updates=4)
    batch = batch_of(6)
    returns = torch.where(batch.mask, torch.linspace(-1, 1, batch.mask.shape[1]).expand_as(batch.mask), 0.0)
    losses, rates = [], []
    for _ in range(30):
        metrics = critic.update(batch, critic.values(batch), returns)
        losses.append(metrics["vf_loss"])
        rates.append(metrics["lr"])
    assert losses[-1] < 0.2 * losses[0], losses
    assert rates[:5] == pytest.approx([2.5e-3, 5e-3, 7.5e-3, 1e-2, 1e-2])  # (k + 1) / 4 of the rate, then the rate
    state = copy.deepcopy(critic.state_dict())
    other, _ = _critic(seed=1)
    other.load_state_dict(state)
    torch.testing.assert_close(other.values(batch), critic.values(batch), rtol=0, atol=0)


PPO = ["algo.adv_baseline=critic", "algo.adv_whiten=true", "critic.lr=1e-3", "algo.adv_gamma=0.99",
       "algo.adv_lambda=0.95"]


def test_in_the_loop_the_policy_trains_on_the_whitened_gae_of_the_critics_values(tmp_path, monkeypatch):
    import minirl.loop as loop

    seen = []
    original = loop.critic_advantages

    def spy(run, sampled, batch, token_rewards=None):
        out = original(run, sampled, batch, token_rewards)
        seen.append((sampled, batch, out, run.critic_targets, copy.deepcopy(run.critic)))
        return out

    monkeypatch.setattr(loop, "critic_advantages", spy)
    metrics, _ = run_steps(tmp_path, *PPO, steps=3)
    for sampled, batch, out, (values, returns), critic in seen:
        torch.testing.assert_close(values, critic.values(batch), rtol=0, atol=0)  # the critic before its updates
        want_a, want_g = gae_advantages(sampled.rewards.float(), values, batch.mask, gamma=0.99, lam=0.95)
        torch.testing.assert_close(out.advantages, masked_whiten(want_a, batch.mask), rtol=0, atol=1e-6)
        torch.testing.assert_close(returns, want_g, rtol=0, atol=1e-6)
    assert not torch.equal(seen[0][3][0], seen[-1][3][0])  # the critic trained between the steps
    for row in metrics:
        assert {"critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm", "critic/vf_explained_var",
                "critic/values_mean", "critic/returns_mean", "policy/loss"} <= set(row)


def test_ppo_with_one_response_a_prompt_trains(tmp_path):
    """verl's and OpenRLHF's PPO sample one response a prompt (rollout.n / --n_samples_per_prompt 1): the critic's GAE
    needs no group."""
    metrics, _ = run_steps(tmp_path, *PPO, "rollout.samples_per_prompt=1", "rollout.prompts_per_step=8", steps=2)
    assert all(math.isfinite(row["policy/loss"]) and math.isfinite(row["critic/vf_loss"]) for row in metrics)
    assert not any(key.endswith("groups_frac") for row in metrics for key in row)  # no groups to count


def test_the_critic_warms_up_before_the_policy_trains(tmp_path):
    """``critic.warmup_steps: 3`` (verl's ``trainer.critic_warmup``): steps 1 and 2 train the critic only."""
    first, start = run_steps(tmp_path / "a", *PPO, "critic.warmup_steps=3", steps=2)
    _, initial = run_steps(tmp_path / "b", *PPO, steps=0)
    assert all(torch.equal(start[name], initial[name]) for name in initial)  # the policy has not moved
    assert all("policy/loss" not in row and "critic/vf_loss" in row for row in first)
    later, weights = run_steps(tmp_path / "c", *PPO, "critic.warmup_steps=3", steps=3)
    assert "policy/loss" in later[2] and not all(torch.equal(weights[n], initial[n]) for n in initial)


def test_an_fp16_critic_skips_its_overflowing_updates_and_logs_no_infinite_norm(tmp_path):
    """Under fp16 a critic update whose gradient overflows is skipped and halves the critic's own scale (not a fault);
    ``critic/grad_norm`` averages only the updates that stepped, and is absent when none did."""
    huge = ["optim.precision=fp16", "optim.loss_scale_initial=1e30", "optim.loss_scale_window_updates=1000"]
    (row,), _ = run_steps(tmp_path / "a", *PPO, *huge, "optim.minibatches_per_step=2", steps=1)
    assert row["critic/fp16_overflows"] == 2 and row["critic/loss_scale"] == 1e30 / 4
    assert "critic/grad_norm" not in row and math.isfinite(row["critic/vf_loss"])
    (fits,), _ = run_steps(tmp_path / "b", *PPO, "optim.precision=fp16", "optim.loss_scale_initial=1024", steps=1)
    assert fits["critic/fp16_overflows"] == 0 and fits["critic/loss_scale"] == 1024
    assert math.isfinite(fits["critic/grad_norm"]) and fits["critic/grad_norm"] > 0


@pytest.mark.parametrize("overrides, message", [
    (["algo.adv_baseline=critic", "algo.adv_std_normalize=true"], "algo.adv_baseline=critic: .* do not go with adv_std"),
    (["algo.adv_lambda=0.9"], "algo.adv_lambda: GAE's lambda needs a critic"),
    (["algo.adv_baseline=critic", "diagnostics.every_steps=5"], "algo.adv_baseline=critic gives one per token"),
    (["algo.adv_baseline=critic", "critic.warmup_steps=2", "algo.logp_old_source=rollout", "moe.routing_replay=R3"],
     "critic.warmup_steps: .* algo.logp_old_source=rollout"),
    (["critic.clip_value_range=0"], "critic.clip_value_range: must be greater than 0"),
])
def test_what_the_critic_does_not_go_with_is_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(ROOT / "configs/demo.yaml", overrides)
