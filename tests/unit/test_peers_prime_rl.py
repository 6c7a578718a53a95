"""``minirl config from-prime-rl``: a prime-rl ``rl`` TOML (our own text, in its style) translated key by key."""

from __future__ import annotations

from pathlib import Path

import pytest

from minirl.cli import main
from minirl.config import ConfigError
from minirl.peers import from_prime_rl, read_prime_rl

RL_TOML = '''
max_steps = 200
seq_len = 4096
max_async_level = 2
output_dir = "outputs/reverse"

[model]
name = "Qwen/Qwen3-30B-A3B"

[ckpt]
interval = 50
keep_last = 3

[wandb]
project = "reverse"

[trainer]
enable_router_replay = true

[trainer.optim]
lr = 3e-6
weight_decay = 0.0
max_norm = 0.5

[trainer.scheduler]
type = "cosine"
warmup_steps = 5
min_lr = 3e-7

[trainer.loss]
kl_tau = 0.0

[trainer.modle]
seq_len = 4096

[orchestrator]
batch_size = 256
rollouts_per_example = 16

[orchestrator.sampling]
temperature = 0.8
max_tokens = 1024

[[orchestrator.env]]
id = "reverse-text"
args = { num_train_examples = 2000 }

[inference.parallel]
tp = 2
'''


@pytest.fixture
def rl_toml(tmp_path: Path) -> Path:
    path = tmp_path / "rl.toml"
    path.write_text(RL_TOML)
    return path


def test_each_key_translates_with_its_origin(rl_toml: Path) -> None:
    out = from_prime_rl(read_prime_rl([str(rl_toml)], []))
    v, o = out.values, out.origin
    assert v["model.path"] == "Qwen/Qwen3-30B-A3B" and o["model.path"] == "model.name = 'Qwen/Qwen3-30B-A3B'"
    assert v["rollout.prompts_per_step"] == 16 and v["rollout.samples_per_prompt"] == 16  # 256 samples / 16 a prompt
    assert v["rollout.max_new_tokens"] == 1024 and v["rollout.temperature"] == 0.8
    assert v["rollout.async_steps"] == 2 and o["rollout.async_steps"] == "max_async_level = 2"
    assert v["moe.routing_replay"] == "R3"
    assert v["task.kind"] == "jsonl" and v["task.path"] == 'verifiers:reverse-text {"num_train_examples": 2000}'
    assert v["task.reward_functions"] == [{"function": "minirl.tasks.verifiers_env:rubric", "name": "reverse-text",
                                           "kwargs": {"env": "reverse-text", "env_args": {"num_train_examples": 2000}}}]
    assert (v["optim.lr"], v["optim.weight_decay"], v["optim.grad_clip_norm"]) == (3e-6, 0.0, 0.5)
    assert (v["optim.lr_schedule"], v["optim.warmup_updates"]) == ("cosine", 5)
    assert v["optim.min_lr_ratio"] == pytest.approx(0.1)
    assert v["optim.global_steps"] == 200 and v["run.seed"] == 42  # the orchestrator's default seed
    assert (v["run.output_dir"], v["run.name"]) == ("outputs", "reverse")
    assert (v["checkpoint.every_steps"], v["checkpoint.keep_last"]) == (50, 3)
    assert v["log.wandb"] is True and v["log.wandb_project"] == "reverse"
    assert not any(key.startswith("algo.") for key in v)  # prime-rl's loss is not minirl's: MiniRL
    assert "inference.parallel.tp" in out.ignored
    out.config()  # a valid minirl config


def test_the_header_says_the_objective_the_differences_and_the_typo(rl_toml: Path) -> None:
    text = from_prime_rl(read_prime_rl([str(rl_toml)], [])).render(str(rl_toml))
    lines = text.splitlines()
    assert lines[0] == f"# minirl config translated from the prime-rl settings of {rl_toml}"
    assert lines[2].startswith("# Objective: minirl's MiniRL (paper Eq. 7), your prime-rl loss has no exact minirl "
                               "equivalent (trainer.loss.kl_tau = 0.0: prime-rl's default loss")
    assert "#   - max_async_level = 2: prime-rl samples with any policy at most 2 steps old" in text
    assert ("#   - trainer.modle.seq_len=4096: not a setting minirl knows how to carry over (did you mean "
            "trainer.model.seq_len?)") in text


def test_prime_rl_defaults_fill_what_the_file_leaves_unset(tmp_path: Path) -> None:
    out = from_prime_rl(read_prime_rl([], ["orchestrator.rollouts_per_example=8"]))
    v = out.values
    assert v["model.path"] == "Qwen/Qwen3-0.6B" and v["rollout.prompts_per_step"] == 16  # batch_size 128 / 8
    assert v["rollout.max_new_tokens"] == 2048 and v["rollout.async_steps"] == 1 and v["optim.lr"] == 1e-6
    assert v["task.path"] == "verifiers:reverse-text" and "moe.routing_replay" not in v
    assert any(line.startswith("max_steps unset") for line in out.differs)


def test_bad_values_are_one_line(rl_toml: Path) -> None:
    with pytest.raises(ConfigError, match=r"^setting trainer.optim.lr='fast': expected a number$"):
        from_prime_rl(read_prime_rl([str(rl_toml)], ["trainer.optim.lr=fast"]))
    with pytest.raises(ConfigError, match="batch_size must be a whole number of rollouts_per_example groups"):
        from_prime_rl(read_prime_rl([str(rl_toml)], ["orchestrator.batch_size=100"]))
    bad = rl_toml.parent / "bad.toml"
    bad.write_text("[trainer\n")
    with pytest.raises(ConfigError, match=r"bad.toml: not valid TOML"):
        read_prime_rl([str(bad)], [])


def test_the_cli_writes_the_translation(rl_toml: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "minirl.yaml"
    assert main(["config", "from-prime-rl", str(rl_toml), "--trainer.optim.lr", "2e-6", "-o", str(target)]) == 0
    text = target.read_text()
    assert "lr: 2.0e-06  # trainer.optim.lr = 2e-06" in text and "routing_replay: R3" in text
    assert main(["config", "from-prime-rl", str(rl_toml), "orchestrator.seed=abc"]) == 2
    assert "minirl: error: setting orchestrator.seed='abc': expected a number" in capsys.readouterr().err


def test_component_keys_eval_envs_lora_checkpoints_and_wandb_as_prime_rl_reads_them(tmp_path: Path) -> None:
    """The review's prime-rl examples: ``trainer.model.name`` and ``[[orchestrator.eval.env]]`` are prime-rl's (not
    typos); an eval environment other than the training one is said; a component's own ``seq_len`` wins over the
    shared one (prime-rl's rl.py); the LoRA comment only on prime-rl's default list; no ``[ckpt]``: no checkpoints."""
    path = tmp_path / "rl.toml"
    path.write_text('seq_len = 8192\n[trainer.model]\nname = "/m"\n[trainer.model.lora]\nrank = 8\n'
                    'target_modules = ["q_proj", "v_proj"]\n[orchestrator]\nseq_len = 4096\nrollouts_per_example = 8\n'
                    '[orchestrator.sampling]\nmax_tokens = 512\n[[orchestrator.env]]\nid = "math"\n'
                    '[[orchestrator.eval.env]]\nid = "aime2024"\n[wandb]\nname = "run-7"\n')
    out = from_prime_rl(read_prime_rl([str(path)], []))
    v = out.values
    assert v["model.path"] == "/m" and not any("trainer.model.name" in line for line in out.not_translated)
    assert ("orchestrator.eval.env id = 'aime2024': minirl evaluates on 'math''s eval_dataset (or task.eval_path: "
            "verifiers:aime2024, scored by 'math''s rubric)") in out.not_translated
    assert not any("did you mean" in line for line in out.not_translated)
    assert any(line.startswith("orchestrator.seq_len = 4096: prime-rl bounds prompt and response") for line in out.differs)
    assert v["model.lora.target_modules"] == ["q_proj", "v_proj"] and "experts" not in out.origin["model.lora.target_modules"]
    assert v["checkpoint.every_steps"] == 0 and out.origin["checkpoint.every_steps"].startswith("no [ckpt]")
    assert v["log.wandb"] is True and "wandb.name = 'run-7': minirl names the wandb run after run.name" in out.differs
    unset = from_prime_rl(read_prime_rl([str(path)], ["orchestrator.sampling.max_tokens=null"])).values
    assert unset["rollout.max_new_tokens"] == 4096  # the orchestrator's own seq_len, not the shared 8192
