"""``minirl.train`` from a TRL user's script: rows in memory, a reward function defined in the script itself."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from minirl.api import _configure, _from_trl_args, train
from minirl.config import ConfigError

SCRIPT = '''\
import json, sys
import minirl

def correct(completions, solution, **kwargs):   # TRL's reward signature, defined here (__main__)
    return [float(c[0]["content"].strip() == s) for c, s in zip(completions, solution)]

rows = [{"prompt": [{"role": "user", "content": w}], "solution": w[::-1]}
        for w in ["abc", "bca", "cab", "acb", "bac", "cba", "aab", "bba"]]
overrides = ["model.preset=qwen3-moe-tiny", "task.chat_template=chat.jinja", "task.eval_fraction=0.25",
             "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=8",
             "optim.global_steps=2", "optim.micro_batch_sequences=4", "eval.num_prompts=2", "eval.samples_per_prompt=2",
             "cold_start.enabled=false", "run.threads=1", "run.output_dir=runs"]
summary = minirl.train(None, *overrides, "run.name=first", train_dataset=rows, reward_funcs=[correct])
again = minirl.train(None, *overrides, "run.name=second", train_dataset=rows, reward_funcs=[correct, "rewards:short"],
                     reward_weights=[1.0, 0.5])
print(json.dumps({"steps": summary.steps, "dir": str(summary.run_dir), "after": again.eval_after}))
'''

REWARDS = '''\
def short(prompts, completions, **kwargs):
    return [1.0 if len(c[0]["content"]) <= 3 else 0.0 for c in completions]
'''


def test_a_trl_style_script_trains_with_rows_and_its_own_reward_function(tmp_path: Path):
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "rewards.py").write_text(REWARDS)
    (tmp_path / "chat.jinja").write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    proc = subprocess.run([sys.executable, "train.py"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "reward functions defined in the script (or lambdas, closures, callable objects) run in this process" in proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["steps"] == 2 and 0.0 <= result["after"] <= 1.0
    saved = yaml.safe_load((tmp_path / "runs" / "first" / "config.yaml").read_text())
    assert saved["task"]["reward_functions"] == [{"function": "__main__:correct", "model": None, "weight": 1.0, "batched": None,
                                                  "name": None, "kwargs": {}, "key": None, "convention": "auto"}]
    assert saved["task"]["reward_timeout_s"] is None and saved["task"]["kind"] == "jsonl"
    data = Path(tmp_path / saved["task"]["path"])
    assert data.parent == tmp_path / "runs" / "_datasets" and len(list(data.parent.iterdir())) == 1  # saved once
    metrics = [json.loads(line) for line in (tmp_path / "runs" / "second" / "metrics.jsonl").read_text().splitlines()]
    assert sum("reward/correct/mean" in m and "reward/short/mean" in m for m in metrics) == 2


def test_arguments_fold_into_the_config_and_mistakes_are_one_line(tmp_path: Path, capsys):
    cfg = _configure(None, [f"run.output_dir={tmp_path}"], "some/model", "train.parquet", str(tmp_path / "eval.jsonl"),
                     ["pkg.mod:fn"], None)
    assert cfg.model.path == "some/model" and cfg.task.eval_path == str(tmp_path / "eval.jsonl")
    assert (cfg.task.kind, cfg.task.path) == ("jsonl", "train.parquet")
    assert cfg.task.reward_functions[0].function == "pkg.mod:fn" and cfg.task.reward_timeout_s == 10.0
    from peft import LoraConfig

    lora = _configure(None, [], None, None, None, None, None, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear")).model.lora
    assert (lora.rank, lora.alpha, lora.dropout, lora.target_modules) == (8, 16.0, 0.0, ["all-linear"])
    lora = _configure(None, [], None, None, None, None, None, LoraConfig(r=4, target_modules=["v_proj", "q_proj"])).model.lora
    assert (lora.rank, lora.alpha, lora.target_modules) == (4, 8.0, ["q_proj", "v_proj"])  # peft's default alpha 8
    experts = LoraConfig(r=4, target_modules=[], target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    lora = _configure(None, [], None, None, None, None, None, experts).model.lora  # TRL's MoE recipe: the experts alone
    assert (lora.target_modules, lora.target_parameters) == ([], ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    with pytest.raises(ConfigError, match=r"^peft_config: expected a peft LoraConfig, got dict$"):
        _configure(None, [], None, None, None, None, None, {"r": 8})
    for given, shown in (({"use_dora": True}, "use_dora=True"), ({"use_rslora": True}, "use_rslora=True"),
                         ({"modules_to_save": ["lm_head"]}, "modules_to_save=['lm_head']")):
        with pytest.raises(ConfigError, match=rf"^peft_config: {re.escape(shown)} is not carried over \("):
            _configure(None, [], None, None, None, None, None, LoraConfig(r=8, target_modules="all-linear", **given))
    # a lambda or a callable object (TRL takes them): named for this process, scored here without a timeout
    from minirl.tasks.rewards import load_reward_function

    class Scorer:
        def __call__(self, completions, **kwargs):
            return [1.0] * len(completions)

    given = [lambda completions, **kw: [0.0] * len(completions), Scorer()]
    task = _configure(None, [], None, None, None, given, None).task
    names = [entry.function for entry in task.reward_functions]
    assert [re.sub(r"_\d+$", "", name) for name in names] == ["minirl.api:_IN_PROCESS._lambda_",
                                                               "minirl.api:_IN_PROCESS.Scorer"], names
    assert [load_reward_function(name) for name in names] == given and task.reward_timeout_s is None
    # functools.partial and TRL's reward factories: the function, with their arguments as the entry's kwargs
    import functools

    from minirl.tasks.trl_rewards import get_soft_overlong_punishment, think_format_reward

    class _SoftOverlongPunishment:  # the shape of trl.rewards' factory object (TRL is not a dependency)
        __module__ = "trl.rewards.other_rewards"

        def __init__(self, max_completion_len: int, soft_punish_cache: int) -> None:
            self.max_completion_len, self.soft_punish_cache = max_completion_len, soft_punish_cache

    funcs = [functools.partial(think_format_reward, tag="x"), get_soft_overlong_punishment(64, 16), _SoftOverlongPunishment(32, 8)]
    entries = _configure(None, [], None, None, None, funcs, None).task.reward_functions
    overlong = "minirl.tasks.trl_rewards:soft_overlong_punishment_reward"
    assert [(e.function, e.kwargs) for e in entries] == [
        ("minirl.tasks.trl_rewards:think_format_reward", {"tag": "x"}),
        (overlong, {"max_completion_len": 64, "soft_punish_cache": 16}),
        (overlong, {"max_completion_len": 32, "soft_punish_cache": 8})]
    with pytest.raises(ConfigError, match=r"^reward_funcs\[0\]: a functools.partial with positional arguments"):
        _configure(None, [], None, None, None, [functools.partial(think_format_reward, ["x"])], None)
    with pytest.raises(ConfigError, match=r"^reward_weights: 1 weights for 2 reward_funcs$"):
        _configure(None, [], None, None, None, ["a:b", "c:d"], [1.0])
    with pytest.raises(ConfigError, match=r"optim.lr"):
        _configure(None, ["optim.lr=fast"], None, None, None, None, None)
    with pytest.raises(ConfigError, match=r"^train_dataset: expected a datasets.Dataset, a list of row dicts"):
        _configure(None, [], None, 42, None, None, None)
    # through minirl.train, a mistake's traceback stops at the call: the message is what to mend, not minirl's frames
    # TRL's eval_dataset={name: dataset}: one held-out set, each row's data_source its name (eval/<name>/accuracy)
    import datasets

    import minirl
    from minirl.api import _dataset_path

    named = _dataset_path({"math": [{"prompt": "1+1", "solution": "2"}], "code": [{"prompt": "x", "solution": "y"}]},
                          tmp_path, "eval_dataset")
    assert datasets.load_from_disk(named)["data_source"] == ["math", "code"]
    with pytest.raises(ConfigError, match=r"^train_dataset: expected a datasets.Dataset"):
        _dataset_path({"math": [{"prompt": "1+1"}]}, tmp_path, "train_dataset")
    # an IterableDataset (TRL takes one with max_steps): the rows the run draws, saved (3 steps x 2 prompts / 0.9, + 1)
    stream = datasets.Dataset.from_list([{"prompt": f"q{n}", "solution": str(n)} for n in range(100)]).to_iterable_dataset()
    cfg = _configure(None, [f"run.output_dir={tmp_path}", "optim.global_steps=3", "rollout.prompts_per_step=2"], None,
                     stream, None, None, None)
    assert len(datasets.load_from_disk(cfg.task.path)) == 8
    assert "train_dataset is an IterableDataset: its first 8 rows are saved" in capsys.readouterr().err
    # GRPOTrainer(model, reward_funcs, train_dataset) copied without args: minirl's defaults, not GRPOConfig()'s: said
    with pytest.raises(ConfigError, match=r"^train_dataset: expected"):
        minirl.train(train_dataset=42, reward_funcs=["a:b"])
    assert "minirl.train: no config and no args: minirl's defaults (optim.lr 0.0001" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"^optim.lr") as error:
        minirl.train(None, "optim.lr=fast")
    frames = [entry.name for entry in error.traceback]
    assert frames[-1] == "wrapper" and "_configure" not in frames and error.value.__suppress_context__


@dataclasses.dataclass
class StandInGRPOConfig:
    """The shape of TRL's GRPOConfig that matters here: a dataclass with declared defaults and ``to_dict``
    (TRL is not a minirl dependency; the real class was checked by hand, see the session notes)."""

    output_dir: str = "trainer_output"
    learning_rate: float = 1e-6
    per_device_train_batch_size: int = 8
    num_generations: int = 8
    loss_type: str = "dapo"
    max_steps: int = -1
    num_train_epochs: float = 3.0
    reward_weights: list | None = None
    logging_dir: str | None = None  # derived from output_dir by TrainingArguments.__post_init__
    report_to: list = dataclasses.field(default_factory=lambda: ["none"])

    def __post_init__(self) -> None:
        self.logging_dir = f"{self.output_dir}/runs"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def test_trls_grpo_config_object_is_translated_as_from_trl_does(tmp_path: Path, capsys):
    args = StandInGRPOConfig(output_dir=str(tmp_path / "run"), learning_rate=3e-6, per_device_train_batch_size=4,
                             num_generations=4, loss_type="grpo", max_steps=12)
    cfg = _from_trl_args(args)
    assert (cfg.optim.lr, cfg.rollout.prompts_per_step, cfg.rollout.samples_per_prompt, cfg.optim.global_steps) == \
        (3e-6, 1, 4, 12)
    assert cfg.algo.name == "grpo" and (cfg.run.output_dir, cfg.run.name) == (str(tmp_path), "run")
    err = capsys.readouterr().err
    assert "minirl: TRL args: objective: your TRL loss as minirl's algo.name=grpo" in err
    assert "not translated" not in err and "not a setting" not in err  # only what the user set is read
    with pytest.raises(ConfigError, match=r"^minirl.train: give a minirl config or TRL's args"):
        train("configs/demo.yaml", args=args)
    with pytest.raises(ConfigError, match=r"^args: expected TRL's GRPOConfig or RLOOConfig, got dict$"):
        _from_trl_args({"learning_rate": 1e-6})


def test_what_grpotrainer_takes_beside_its_args(tmp_path: Path):
    """``GRPOConfig(reward_weights=...)`` weighs the ``reward_funcs`` given beside it; ``num_train_epochs`` counts the
    ``train_dataset``'s rows; one bare reward function; a loaded model object, ``processing_class`` or ``rollout_func``
    are one line."""
    from minirl.api import _rows

    args = StandInGRPOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=4,
                             num_train_epochs=2.0, reward_weights=[1.0, 0.5])
    rows = [{"prompt": f"p{i}", "answer": "a"} for i in range(8)]
    assert _rows(rows) == 8 and _rows({"train": rows}) == 8 and _rows("x.jsonl") is None
    cfg = _from_trl_args(args, rewards_given=True, train_rows=8)
    assert cfg.optim.global_steps == 2 * 8 // 1  # 2 epochs x 8 rows / 1 prompt a step (4 rows / 4 generations)
    seen = {}

    def stop(config, *overrides, **kwargs):  # the arguments train() would configure the run with
        seen.update(kwargs)
        raise SystemExit

    import minirl.api as api
    real = api._configure
    api._configure = lambda config, overrides, model, train_dataset, eval_dataset, reward_funcs, reward_weights, *rest: \
        stop(config, reward_funcs=reward_funcs, reward_weights=reward_weights)
    try:
        with pytest.raises(SystemExit):
            train(args=args, reward_funcs=["a:b", "c:d"], train_dataset=rows)
        assert seen["reward_weights"] == [1.0, 0.5]
        with pytest.raises(SystemExit):
            train(args=StandInGRPOConfig(output_dir=str(tmp_path / "run")), reward_funcs="a:b")
        assert seen["reward_funcs"] == ["a:b"]
    finally:
        api._configure = real

    class Loaded:
        name_or_path = "/models/qwen"

    with pytest.raises(ConfigError, match=r"^minirl.train: model: give the model's path .* loaded from '/models/qwen'$"):
        train("configs/demo.yaml", model=Loaded())
    for name in ("processing_class", "rollout_func"):
        with pytest.raises(ConfigError, match=rf"^minirl.train: {name} is not taken \("):
            train("configs/demo.yaml", **{name: object()})


@dataclasses.dataclass
class RLOOConfig:
    """The shape of TRL's RLOOConfig that matters here (its class name tells the trainer): declared defaults, to_dict."""

    output_dir: str = "trainer_output"
    num_generations: int = 2
    beta: float = 0.05
    normalize_advantages: bool = False
    max_steps: int = -1

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def test_trls_rloo_config_object_is_translated_as_rloo(tmp_path: Path, capsys):
    cfg = _from_trl_args(RLOOConfig(output_dir=str(tmp_path / "run"), num_generations=4, normalize_advantages=True,
                                    max_steps=3))
    a = cfg.algo
    assert (a.name, a.sequence_ratio, a.adv_baseline, a.adv_whiten_over, a.kl_in_reward_coef) == (
        "gspo", "sum", "leave_one_out", "responses", 0.05)  # RLOO's default beta, in the reward
    assert "objective: your TRL RLOO loss as minirl's algo.name=gspo" in capsys.readouterr().err
