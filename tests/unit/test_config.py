"""Config loading: every shipped config parses; user mistakes become one line with exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from minirl.cli import main
from minirl.config import Config, ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p for d in ("configs", "experiments") for p in (ROOT / d).rglob("*")
                 if p.suffix in (".yaml", ".yml", ".toml") and p.name != "arms.yaml")  # arms.yaml: arm tables, not configs


def test_there_are_shipped_configs():
    assert any(p.parent.name == "configs" for p in SHIPPED)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_config_parses_and_pins_every_algorithm_knob(path):
    from minirl.experiments.arms import load_arm  # the arm files spell optim.global_steps (renamed keys mapped)

    cfg = load_arm(path) if "experiments" in path.relative_to(ROOT).parts else load_config(path)
    assert isinstance(cfg, Config)
    raw = yaml.safe_load(path.read_text()) if path.suffix != ".toml" else {}
    if path.parent.name == "configs":
        # presets pin every knob of the sections that define the algorithm, never relying on defaults
        for section in ("rollout", "optim", "algo", "moe"):
            model = getattr(cfg, section)
            missing = set(type(model).model_fields) - set(raw.get(section, {}))
            assert not missing, f"{path.name} does not pin {section}.{sorted(missing)}"


@pytest.mark.parametrize(
    "override, expected",
    [
        ("rollout.samples_per_prompt=0", "rollout.samples_per_prompt: must be greater than or equal to 1"),
        ("rollout.samples_per_prompt=1", "rollout.samples_per_prompt=1: algo.adv_baseline=group_mean compares each "
                                         "response with its group's others; one response a prompt needs"),
        ("algo.eps_low=-0.1", "algo.eps_low: must be greater than or equal to 0"),
        ("algo.eps_high=-1", "algo.eps_high: must be greater than or equal to 0"),
        ("optim.minibatches_per_step=3", "optim.minibatches_per_step: must divide the global batch"),
        ("moe.routing_replay=R2+R3", "moe.routing_replay: R2 and R3 cannot be combined"),
        ("moe.routing_replay=R4", "moe.routing_replay: must be 'none', 'R2' or 'R3'"),
        ("rollout.tempreature=0.5", "rollout.tempreature: unknown key"),
        ("optim.lr=fast", "optim.lr: must be a valid number"),
        ("rollout.top_p=1.5", "rollout.top_p: must be less than or equal to 1"),
        ("task.kind=jsonl", "task.path: required when task.kind is 'jsonl'"),
        ("rollout.precision=int3", "rollout.precision: must be"),
        ("nonsense", "expected key=value"),
    ],
)
def test_bad_values_name_the_key(override, expected):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_overrides_apply_with_yaml_types(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 0.001\nrollout:\n  prompts_per_step: 4\n")
    cfg = load_config(path, ["optim.lr=3e-4", "algo.clip=false", "moe.routing_replay=R2", "run.name=x"])
    assert cfg.optim.lr == 3e-4 and cfg.algo.clip is False and cfg.moe.routing_replay == "R2"
    assert cfg.rollout.prompts_per_step == 4 and cfg.run.name == "x"


def test_off_on_yes_no_are_strings_where_a_string_is_expected(tmp_path):
    """YAML 1.2 booleans: ``update_guard: off`` is the mode, not False (PyYAML's YAML 1.1 made it False and the
    config refused it: "must be 'undo', 'check' or 'off' (got False)"); bool keys still read off / yes as booleans."""
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  update_guard: off\nalgo:\n  clip: off\n  is_correction: yes\ntask:\n  stop_strings: [no, 'N']\n")
    cfg = load_config(path)
    assert cfg.optim.update_guard == "off" and cfg.algo.clip is False and cfg.algo.is_correction is True
    assert cfg.task.stop_strings == ["no", "N"]
    cfg = load_config(None, ["optim.update_guard=off", "algo.clip=no", "algo.is_correction=True", "task.stop_strings=[On]"])
    assert cfg.optim.update_guard == "off" and cfg.algo.clip is False and cfg.algo.is_correction is True
    assert cfg.task.stop_strings == ["On"]
    assert yaml.safe_load("a: off") == {"a": False}  # PyYAML's own loader is left as it is


def test_gdpo_refuses_the_advantage_variants_it_replaces():
    assert load_config(None, ["algo.multi_objective_aggregation=normalize_then_sum"]).algo.multi_objective_aggregation \
        == "normalize_then_sum"
    for other in ("algo.adv_baseline=leave_one_out", "algo.adv_std_scope=batch", "algo.adv_nonzero_rescale=true",
                  "algo.reward_clip_range=[0, 1]"):
        with pytest.raises(ConfigError, match="normalize_then_sum normalises the rewards itself"):
            load_config(None, ["algo.multi_objective_aggregation=normalize_then_sum", other])
    # adv_whiten: its last whitening over the step's tokens (verl's gdpo); over responses already is the default
    gdpo = ["algo.multi_objective_aggregation=normalize_then_sum", "algo.adv_whiten=true"]
    assert load_config(None, gdpo).algo.adv_whiten is True
    with pytest.raises(ConfigError, match="normalize_then_sum normalises the rewards itself"):
        load_config(None, [*gdpo, "algo.adv_whiten_over=responses"])


def test_a_reward_clip_range_is_low_then_high():
    assert load_config(None, ["algo.reward_clip_range=[-1, 1]"]).algo.reward_clip_range == (-1.0, 1.0)
    with pytest.raises(ConfigError, match=r"reward_clip_range \[1.0, -1.0\]: the low bound must be below the high"):
        load_config(None, ["algo.reward_clip_range=[1, -1]"])


def test_a_section_rule_says_its_values_without_dumping_the_section():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["algo.entropy_coef_min=2"])
    assert str(err.value) == "algo: entropy_coef_min (2.0) must not exceed entropy_coef_max (1.0)"


@pytest.mark.parametrize("override, key", [("rollout.max_new_tokens=true", "rollout.max_new_tokens"),
                                           ("optim.lr=false", "optim.lr"),
                                           ("task.max_tool_calls_per_turn=true", "task.max_tool_calls_per_turn"),
                                           ("algo.eps_low=true", "algo.eps_low")])
def test_true_or_false_for_a_number_is_an_error_not_one_or_zero(override, key, tmp_path):
    """pydantic's lax mode would read them as 1 and 0; in a file as on the command line they are refused."""
    with pytest.raises(ConfigError, match=rf"^{key}: must be a valid (integer|number).*\(got '(true|false)'\)$"):
        load_config(None, [override])
    section, name = key.split(".")
    path = tmp_path / "c.yaml"
    path.write_text(f"{section}:\n  {name}: yes\n")  # YAML 1.1's yes is true
    with pytest.raises(ConfigError, match=rf"c.yaml: {key}: must be a valid"):
        load_config(path)
    # a bool field still takes them, and a number still takes numbers
    cfg = load_config(None, ["rollout.partial_rollout=true", "optim.lr=1", "task.max_tool_calls_per_turn=2"])
    assert cfg.rollout.partial_rollout is True and cfg.optim.lr == 1.0 and cfg.task.max_tool_calls_per_turn == 2


def test_toml_configs_load(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[optim]\nlr = 0.002\nminibatches_per_step = 4\n")
    assert load_config(path).optim.minibatches_per_step == 4


def test_file_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.yaml: config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  lr: [1,\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:\d+: not valid YAML"):
        load_config(bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text("optim:\n  learning_rate: 1\n")
    with pytest.raises(ConfigError, match=r"typo.yaml: optim.learning_rate: unknown key"):
        load_config(typo)


@pytest.mark.parametrize("overrides, allowed", [
    (["algo.adv_baseline=critic", "algo.adv_whiten=true"], True),  # verl's and OpenRLHF's PPO (GAE over a critic)
    (["algo.adv_baseline=none", "algo.adv_whiten=true"], True),  # REINFORCE++
    (["algo.adv_baseline=none", "algo.adv_std_normalize=true", "algo.adv_std_scope=batch"], True),
    (["algo.adv_baseline=greedy"], True),  # ReMax: the greedy completion is the baseline
    (["algo.adv_baseline=leave_one_out"], False),
    (["algo.adv_baseline=none", "algo.adv_std_normalize=true"], False),  # the group's std
    (["algo.adv_baseline=none", "rollout.filter_groups=true"], False),
])
def test_one_sample_a_prompt_only_with_a_baseline_that_needs_no_group(overrides, allowed):
    overrides = ["rollout.samples_per_prompt=1", "rollout.prompts_per_step=8", "optim.micro_batch_sequences=8", *overrides]
    if allowed:
        assert load_config(None, overrides).rollout.samples_per_prompt == 1
    else:
        with pytest.raises(ConfigError, match=r"rollout.samples_per_prompt=1: (.* compares each response with its "
                                              r"group|.* needs groups; turn it off, or sample 2 or more)"):
            load_config(None, overrides)


def test_whitening_needs_two_responses_a_step():
    one = ["rollout.samples_per_prompt=1", "rollout.prompts_per_step=1", "optim.micro_batch_sequences=1",
           "algo.adv_baseline=critic"]
    load_config(None, one)  # GAE without whitening: fine
    with pytest.raises(ConfigError, match=r"algo.adv_whiten: whitening over the step's tokens needs 2 or more responses"):
        load_config(None, [*one, "algo.adv_whiten=true"])


def test_cli_prints_one_line_and_exits_2(capsys):
    assert main(["train", str(ROOT / "configs" / "demo.yaml"), "rollout.samples_per_prompt=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "rollout.samples_per_prompt" in err


def test_cli_subprocess_has_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "minirl.cli", "train", str(ROOT / "configs" / "demo.yaml"), "optim.minibatches_per_step=7"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "optim.minibatches_per_step" in proc.stderr


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["algo.name=ppo"], "algo.name: must be one of 'minirl', 'grpo', 'cispo', 'gspo', 'sapo', 'vespo' (got 'ppo')"),
        (["algo.name=gspo", "algo.clip=false"], "algo.clip: not a knob of algo.name=gspo"),
        (["algo.name=cispo", "optim.micro_batch_sequences=5"], "optim.micro_batch_sequences: CISPO"),
        (["algo.name=cispo", "optim.micro_batch_max_tokens=512"], "optim.micro_batch_max_tokens: CISPO"),
    ],
)
def test_objective_variants_show_only_their_knobs(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert expected in str(err.value)


def test_objective_defaults():
    assert load_config(None, ["algo.eps_high=0.3"]).algo.name == "minirl"
    grpo = load_config(None, ["algo.name=grpo"]).algo
    assert grpo.adv_std_normalize and not grpo.is_correction
    gspo = load_config(None, ["algo.name=gspo"]).algo
    assert (gspo.eps_low, gspo.eps_high) == (3e-4, 4e-4)


def test_missing_optional_sink_is_a_config_error(tmp_path, monkeypatch):
    import builtins

    from minirl.metrics import MetricsLogger

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(ConfigError, match=r"log.wandb: true needs the 'wandb' package"):
        MetricsLogger(tmp_path, total_steps=1, console=False, wandb=True)


def test_sweep_seeds_count_or_list():
    from minirl.cli import parse_seeds

    assert parse_seeds("3") == [0, 1, 2]
    assert parse_seeds("1,2") == [1, 2]
    assert parse_seeds("0,") == [0]
    assert parse_seeds(" 4 ") == [0, 1, 2, 3]
    for bad in ("0", "", ",", "a", "1,1", "-1,2", "1.5"):
        with pytest.raises(ConfigError, match="--seeds"):
            parse_seeds(bad)
    with pytest.raises(ConfigError, match="seed 0 alone"):
        parse_seeds("0")


@pytest.mark.parametrize("old, new", [("steps", "global_steps"), ("warmup_steps", "warmup_updates")])
def test_a_renamed_optim_key_is_one_line_naming_the_new_one(tmp_path, old, new):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"optim.{old}=3"])
    assert str(err.value).startswith(f"optim.{old}: renamed to optim.{new} (") and "\n" not in str(err.value)
    path = tmp_path / "old.yaml"
    path.write_text(f"optim:\n  {old}: 3\n")
    with pytest.raises(ConfigError, match=rf"^{path}: optim\.{old}: renamed to optim\.{new} "):
        load_config(path)
    assert getattr(load_config(None, [f"optim.{new}=3"]).optim, new) == 3


def test_cispo_needs_whole_groups_in_a_micro_batch_only_for_its_group_denominators():
    split = ["algo.name=cispo", "rollout.samples_per_prompt=4", "optim.micro_batch_sequences=3", "rollout.prompts_per_step=3"]
    with pytest.raises(ConfigError, match="must hold whole groups"):
        load_config(None, split)
    assert load_config(None, [*split, "algo.aggregation=token_mean"]).algo.aggregation == "token_mean"  # the batch's tokens
    assert load_config(None, ["algo.name=cispo", "algo.aggregation=token_mean", "optim.micro_batch_max_tokens=64"])
