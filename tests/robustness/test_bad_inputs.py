"""A corpus of bad inputs: each gets one exact, one-line message (and, via the CLI, exit code 2).

Config typos and impossible values (through ``minirl.cli.main``), data files and JSONL rows
(``tests/robustness/corpus``), reward-function specs, reward functions that raise, return
nonsense or hang (``bad_rewards.py``, run by ``RewardRunner``), and checkpoint directories that
are incomplete, corrupt, of another model, or pickle-only.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest

from minirl.cli import main
from minirl.models.io import (
    ModelLoadError,
    check_compatible,
    load_model_and_tokenizer,
    save_checkpoint,
)
from minirl.tasks import (
    JsonlTask,
    RewardFunctionError,
    RewardRunner,
    RewardSpecError,
    TaskDataError,
    build_task,
)
from minirl.types import Prompt
from tests.robustness.bad_rewards import where_raised

CORPUS = Path(__file__).parent / "corpus"
MINIMAL = CORPUS / "minimal.yaml"
BAD = "tests.robustness.bad_rewards"


def cli_error(capsys: pytest.CaptureFixture, *argv: str) -> str:
    """Run the CLI in-process; assert exit code 2 and a single stderr line; return its message."""
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("minirl: error: "), err
    return err[len("minirl: error: ") : -1]


# --- 1. config files and overrides, via the CLI --------------------------------------------------

CONFIG_FILES = [
    ("typo_key.yaml", "optim.lrr: unknown key (did you mean 'lr'?)"),
    ("typo_section.yaml", "optimm: unknown key (did you mean 'optim'?)"),
    ("zero_temperature.yaml", "rollout.temperature: must be greater than 0 (got 0)"),
    ("steps_not_int.yaml", "optim.global_steps: must be a valid integer, unable to parse string as an integer (got 'ten')"),
    ("jsonl_without_path.yaml", "task.path: required when task.kind is 'jsonl' (a JSONL file with prompt/answer)"),
    ("unknown_objective.yaml", "algo.name: must be one of 'minirl', 'grpo', 'cispo', 'gspo', 'sapo', 'vespo' (got 'ppo')"),
    ("knob_of_other_objective.yaml", "algo.tis_cap: not a knob of algo.name=gspo"),
    ("minibatches_do_not_divide.yaml",
     "optim.minibatches_per_step: must divide the global batch prompts_per_step x samples_per_prompt = 9 (got 2)"),
    ("top_level_list.yaml", "the top level must be a mapping of sections"),
]


@pytest.mark.parametrize("name, message", CONFIG_FILES)
def test_bad_config_file(capsys: pytest.CaptureFixture, name: str, message: str) -> None:
    path = CORPUS / name
    assert cli_error(capsys, "train", str(path)) == f"{path}: {message}"


def test_config_file_not_yaml_names_the_line(capsys: pytest.CaptureFixture) -> None:
    path = CORPUS / "not_yaml.yaml"
    assert cli_error(capsys, "train", str(path)) == (
        f"{path}:3: not valid YAML (while parsing a flow sequence)"
    )


def test_duplicate_key_names_the_line(capsys: pytest.CaptureFixture) -> None:
    path = CORPUS / "duplicate_key.yaml"  # PyYAML alone keeps the last lr silently
    assert cli_error(capsys, "train", str(path)) == (
        f"{path}:6: duplicate key 'lr' (first at line 4); a key may appear once per section"
    )


def test_a_merge_key_may_be_overridden(tmp_path: Path) -> None:
    from minirl.config import _read_file

    path = tmp_path / "merge.yaml"
    path.write_text("defaults: &defaults\n  lr: 1.0e-3\n  steps: 2\noptim:\n  <<: *defaults\n  lr: 3.0e-4\n")
    assert _read_file(path)["optim"] == {"lr": 3.0e-4, "steps": 2}


def test_config_file_not_toml(capsys: pytest.CaptureFixture) -> None:
    path = CORPUS / "not_toml.toml"
    assert cli_error(capsys, "train", str(path)) == f"{path}: not valid TOML (Invalid value (at line 2, column 6))"


def test_config_file_missing(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    assert cli_error(capsys, "train", str(path)) == f"{path}: config file not found"


OVERRIDES = [
    ("optim.lr=-1", "optim.lr: must be greater than or equal to 0 (got -1)"),
    ("lr=1e-4", "lr: unknown key"),
    ("rollout.samples_per_prompt=0", "rollout.samples_per_prompt: must be greater than or equal to 1 (got 0)"),
    ("rollout.top_p=1.5", "rollout.top_p: must be less than or equal to 1 (got 1.5)"),
    ("rollout.precision=int4", "rollout.precision: must be 'fp32', 'bf16', 'fp16', 'fp8_e4m3', 'fp8_e5m2' or 'fp4_e2m1' (got 'int4')"),
    ("rollout.fp4_block_size=0", "rollout.fp4_block_size: must be greater than 0 (got 0)"),
    ("rollout.kv_cache_precision=int8", "rollout.kv_cache_precision: must be 'same', 'fp8_e4m3' or 'fp8_e5m2' (got 'int8')"),
    ("task.kind=poetry", "task.kind: must be 'reverse', 'add', 'sort' or 'jsonl' (got 'poetry')"),
    ("task.reward_on_error=ignore", "task.reward_on_error: must be 'fail' or 'fallback' (got 'ignore')"),
    ("task.reward_timeout_s=0", "task.reward_timeout_s: must be greater than 0 (got 0)"),
    ("task.reward_fallback=.nan", "task.reward_fallback: must be a finite number (got nan)"),
    ("task.reward_workers=0", "task.reward_workers: must be greater than or equal to 1 (got 0)"),
    ("task.on_bad_row=drop", "task.on_bad_row: must be 'error' or 'skip' (got 'drop')"),
    ("task.max_prompt_chars=0", "task.max_prompt_chars: must be greater than or equal to 1 (got 0)"),
    # optimizer values: finite and in range (lr=.inf trained to all-NaN weights, lr=1e30 to weights of 1e30)
    ("optim.lr=.inf", "optim.lr: must be a finite number (got inf)"),
    ("optim.lr=1e30", "optim.lr: must be less than or equal to 1 (got '1e30')"),
    ("optim.lr=1.0e+30", "optim.lr: must be less than or equal to 1 (got 1e+30)"),
    ("optim.adam_eps=.nan", "optim.adam_eps: must be a finite number (got nan)"),
    ("optim.weight_decay=.inf", "optim.weight_decay: must be a finite number (got inf)"),
    ("optim.grad_clip_norm=.inf", "optim.grad_clip_norm: must be a finite number (got inf)"),
    ("cold_start.lr=.nan", "cold_start.lr: must be a finite number (got nan)"),
    ("eval.temperature=-1", "eval.temperature: must be greater than or equal to 0 (got -1)"),
    ("rollout.top_k=-1", "rollout.top_k: must be greater than or equal to 0 (got -1)"),
    ("rollout.min_p=1", "rollout.min_p: must be less than 1 (got 1)"),
    ("eval.temperature=0",  # greedy evaluation with the default 4 samples per prompt
     "eval.samples_per_prompt: greedy evaluation (eval.temperature 0) gives identical samples; set 1 (got 4)"),
]


@pytest.mark.parametrize("override, message", OVERRIDES)
def test_bad_override(capsys: pytest.CaptureFixture, override: str, message: str) -> None:
    assert cli_error(capsys, "train", str(MINIMAL), override) == f"{MINIMAL}: {message}"


def test_override_without_equals(capsys: pytest.CaptureFixture) -> None:
    assert cli_error(capsys, "train", str(MINIMAL), "optim.lr") == "override 'optim.lr': expected key=value, e.g. optim.lr=1e-4"


# --- 2. data files and JSONL rows ----------------------------------------------------------------

BAD_ROWS = [
    ("not_json.jsonl", "not valid JSON (Expecting property name enclosed in double quotes at column 2)"),
    ("truncated_row.jsonl", "not valid JSON (Expecting ',' delimiter at column 33)"),
    ("row_array.jsonl", 'expected a JSON object with "prompt" and "answer", got an array'),
    ("row_string.jsonl", 'expected a JSON object with "prompt" and "answer", got a string'),
    ("row_null.jsonl", 'expected a JSON object with "prompt" and "answer", got null'),
    ("missing_prompt.jsonl", 'field "prompt" is missing'),
    ("missing_answer.jsonl", 'field "answer" is missing'),
    ("prompt_number.jsonl", 'field "prompt" must be a string or a list of chat messages, got a number'),
    ("prompt_list.jsonl", 'field "prompt" message 0 must be an object with string "role" and "content", got a string'),
    ("answer_bool.jsonl", 'field "answer" must be a string or a number, got a boolean'),
    ("answer_object.jsonl", 'field "answer" must be a string or a number, got an object'),
    ("answer_nan.jsonl", 'field "answer" must be finite, got nan'),
    ("empty_prompt.jsonl", 'field "prompt" is empty'),
    ("empty_answer.jsonl", 'field "answer" is empty'),
    ("long_prompt.jsonl", "prompt is 54 characters, longer than task.max_prompt_chars=40"),
    ("latin1.jsonl", "not valid UTF-8 (byte 15 of the line)"),
]


@pytest.mark.parametrize("name, message", BAD_ROWS)
def test_bad_row_names_file_and_line(name: str, message: str) -> None:
    path = CORPUS / name
    with pytest.raises(TaskDataError) as error:
        JsonlTask(path, max_prompt_chars=40)
    assert str(error.value) == f"{path}:2: {message}"


@pytest.mark.parametrize("name, message", BAD_ROWS)
def test_bad_row_is_skipped_and_counted(name: str, message: str) -> None:
    path = CORPUS / name
    task = JsonlTask(path, max_prompt_chars=40, on_bad_row="skip", eval_fraction=0.0)
    assert [p.text for p in task.train_prompts()] == ["2+2?", "2+2?"]
    assert task.skipped_rows == 1 and task.skipped_reasons == [f"{path}:2: {message}"]


def test_prompt_longer_than_the_context_in_tokens() -> None:
    path = CORPUS / "long_prompt.jsonl"
    words = lambda prompt: len(prompt.text.split())  # noqa: E731 - a stand-in tokenizer
    assert JsonlTask(path, max_prompt_tokens=11, count_tokens=words, eval_fraction=0.0).skipped_rows == 0
    with pytest.raises(TaskDataError) as error:
        JsonlTask(path, max_prompt_tokens=10, count_tokens=words)
    assert str(error.value) == (f"{path}:2: prompt is 11 tokens, longer than 10 (task.max_prompt_tokens, or the model's "
                                "context less rollout.max_new_tokens)")


def test_task_max_prompt_tokens_is_verls_max_prompt_length(tmp_path: Path) -> None:
    """The limit below the model's context: the stricter of the two bounds a row, counted by the run's tokenizer."""
    from minirl.config import load_config
    from minirl.runtime import build_model
    from minirl.runtime import build_task as build_run_task

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": "x" * n, "answer": "1"}) + "\n" for n in (5, 30, 8)))
    common = ["model.preset=qwen3-moe-tiny", "task.kind=jsonl", f"task.path={data}", "task.eval_fraction=0.5"]
    cfg = load_config(None, [*common, "task.max_prompt_tokens=10", "task.on_bad_row=skip"])  # verl's filter_overlong_prompts
    model, tokenizer = build_model(cfg)
    assert build_run_task(cfg, model, tokenizer).skipped_rows == 1  # the 30-character prompt (one token a character)
    with pytest.raises(TaskDataError, match=r"prompt is 30 tokens, longer than 10 \(task.max_prompt_tokens"):
        build_run_task(load_config(None, [*common, "task.max_prompt_tokens=10"]), model, tokenizer)
    assert build_run_task(load_config(None, common), model, tokenizer).skipped_rows == 0


FILE_ERRORS = [
    ("blank_lines.jsonl", "no rows (expected one JSON object per line)", "error"),
    ("all_rows_bad.jsonl",
     "no usable rows (2 bad row(s) skipped; the first: {path}:1: expected a JSON object with \"prompt\" and \"answer\", got an array)",
     "skip"),
    ("no_such_file.jsonl", "no such file", "error"),
]


def test_a_directory_load_dataset_cannot_read_is_one_line() -> None:
    """The corpus directory holds JSONL files of every bad shape: as a dataset repository it cannot be read."""
    with pytest.raises(TaskDataError) as error:
        JsonlTask(CORPUS)
    message = str(error.value)
    assert message.startswith(f"{CORPUS}: a directory, but neither a save_to_disk directory nor a dataset repository "
                              "load_dataset reads with config None, split 'train' (") and "\n" not in message


@pytest.mark.parametrize("name, message, on_bad_row", FILE_ERRORS)
def test_bad_data_file_names_the_file(name: str, message: str, on_bad_row: str) -> None:
    path = CORPUS / name
    with pytest.raises(TaskDataError) as error:
        JsonlTask(path, on_bad_row=on_bad_row)  # type: ignore[arg-type]
    assert str(error.value) == f"{path}: {message.format(path=path)}"


def test_unreadable_data_file_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "secret.jsonl"
    path.write_text('{"prompt": "p", "answer": "a"}\n')
    path.chmod(0)
    real_read_bytes = Path.read_bytes

    def read_bytes(self: Path) -> bytes:  # root reads anything: make it fail as for a user
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real_read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    with pytest.raises(TaskDataError) as error:
        JsonlTask(path)
    assert str(error.value) == f"{path}: cannot read (Permission denied)"


def test_missing_eval_file_names_it() -> None:
    with pytest.raises(TaskDataError) as error:
        JsonlTask(CORPUS / "latin1.jsonl", eval_path=CORPUS / "no_eval.jsonl", on_bad_row="skip")
    assert str(error.value) == f"{CORPUS / 'no_eval.jsonl'}: no such file"


def test_data_errors_via_the_cli(capsys: pytest.CaptureFixture) -> None:
    missing = CORPUS / "no_such_file.jsonl"
    args = ["eval", "--config", str(MINIMAL), "qwen3-moe-tiny", "task.kind=jsonl"]
    assert cli_error(capsys, *args, f"task.path={missing}") == f"{missing}: no such file"
    path = CORPUS / "row_null.jsonl"
    assert cli_error(capsys, *args, f"task.path={path}") == (
        f'{path}:2: expected a JSON object with "prompt" and "answer", got null'
    )


# --- 3. reward-function specs --------------------------------------------------------------------

SPECS = [
    ("no_colon_here", "expected 'package.module:function' or 'path/to/file.py[:function]'"),
    ("tests.robustness.no_such_module:fn", f"module 'tests.robustness.no_such_module' not found (looked in the working "
     f"directory {os.getcwd()} and on sys.path; a file path also works: 'tests/robustness/no_such_module.py:fn')"),
    ("no_such_package.rewards:fn", f"module 'no_such_package.rewards' not found (looked in the working directory "
     f"{os.getcwd()} and on sys.path; a file path also works: 'no_such_package/rewards.py:fn')"),
    (f"{BAD}:no_such_function", f"'{BAD}' has no attribute 'no_such_function'"),
    (f"{BAD}:NOT_CALLABLE", "'NOT_CALLABLE' is a int, not callable"),
    ("/no/such/rewards.py:score", "file '/no/such/rewards.py' not found"),
]


@pytest.mark.parametrize("spec, message", SPECS)
def test_bad_reward_spec(spec: str, message: str) -> None:
    with pytest.raises(RewardSpecError) as error:
        build_task("reverse", difficulty=2, num_train=2, num_eval=1, reward_function=spec)
    assert str(error.value) == f"reward function {spec!r}: {message}"


def test_bad_reward_spec_via_the_cli(capsys: pytest.CaptureFixture) -> None:
    spec = f"{BAD}:no_such_function"
    message = cli_error(capsys, "eval", "--config", str(MINIMAL), "qwen3-moe-tiny", f"task.reward_function={spec}")
    assert message == f"reward function {spec!r}: '{BAD}' has no attribute 'no_such_function'"


def test_a_lambda_cannot_run_with_a_timeout() -> None:
    task = build_task("reverse", difficulty=2, num_train=2, num_eval=1, reward_function=lambda p, c, a: 1.0)
    with pytest.raises(RewardSpecError) as error:
        RewardRunner(task, timeout_s=1.0)
    assert str(error.value) == (
        f"reward function {__name__}:test_a_lambda_cannot_run_with_a_timeout.<locals>.<lambda>: cannot be imported "
        "by a worker process (a lambda, closure or function in __main__); define it in a module and name it "
        "'module:function', or set task.reward_timeout_s=null to run it in the trainer without a timeout"
    )
    RewardRunner(task, timeout_s=None).close()  # in the trainer's process it is fine


# --- 4. reward functions that raise, return nonsense, crash or hang ------------------------------

PROMPTS = [Prompt(text="rev ab\n", answer="ba")]

BAD_FUNCTIONS = [
    ("raises", f"raised ValueError: no answer found{where_raised('raises')}"),
    ("returns_nan", "returned nan, expected a finite number"),
    ("returns_inf", "returned -inf, expected a finite number"),
    ("returns_str", "returned str '1.0', expected a number"),
]


def _runner(name: str, timeout_s: float | None, **kwargs: object) -> RewardRunner:
    task = build_task("reverse", difficulty=2, num_train=2, num_eval=1, reward_function=f"{BAD}:{name}")
    return RewardRunner(task, timeout_s=timeout_s, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout_s", [None, 5.0], ids=["in_process", "in_worker"])
@pytest.mark.parametrize("name, problem", BAD_FUNCTIONS)
def test_bad_reward_function_fails_in_one_line(name: str, problem: str, timeout_s: float | None) -> None:
    with _runner(name, timeout_s) as runner:
        assert runner.in_worker == (timeout_s is not None)
        with pytest.raises(RewardFunctionError) as error:
            runner.score(PROMPTS, [(0, "ba")])
    assert str(error.value) == f"reward function {BAD}:{name} {problem}"


WORKER_ONLY = [
    ("hangs", "did not return within 0.5 s (task.reward_timeout_s); its worker process was killed"),
    ("sleeps", "did not return within 0.5 s (task.reward_timeout_s); its worker process was killed"),
    ("exits", f"raised SystemExit: 3{where_raised('exits')}"),
    ("crashes_on_crash", "killed its worker process (exit code 7)"),
]


@pytest.mark.parametrize("name, problem", WORKER_ONLY)
def test_hanging_or_crashing_reward_function_fails_in_one_line(name: str, problem: str) -> None:
    with _runner(name, 0.5) as runner:
        with pytest.raises(RewardFunctionError) as error:
            runner.score(PROMPTS, [(0, "ba"), (0, "crash")])
        assert str(error.value) == f"reward function {BAD}:{name} {problem}"
        if name == "crashes_on_crash":  # the replacement worker scores the next call
            assert runner.score(PROMPTS, [(0, "ba"), (0, "ab")])[0].tolist() == [1.0, 0.0]


def test_bad_reward_function_via_the_cli(capsys: pytest.CaptureFixture) -> None:
    message = cli_error(
        capsys, "eval", "--config", str(MINIMAL), "qwen3-moe-tiny", f"task.reward_function={BAD}:raises",
        "eval.num_prompts=1", "eval.samples_per_prompt=1", "rollout.max_new_tokens=2",
    )
    assert message == f"reward function {BAD}:raises raised ValueError: no answer found{where_raised('raises')}"


# --- 5. checkpoint directories -------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, tokenizer = load_model_and_tokenizer("qwen3-moe-tiny", seed=0)
    return save_checkpoint(model, tokenizer, tmp_path_factory.mktemp("ckpt") / "good")


def _copy(checkpoint: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(checkpoint, tmp_path / "ckpt"))


def _truncate(directory: Path) -> None:
    weights = directory / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])


def _corrupt_header(directory: Path) -> None:
    weights = directory / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:12] = b"\x00\x01\x02\x03"
    weights.write_bytes(bytes(data))


def _shard(directory: Path) -> None:
    (directory / "model.safetensors").rename(directory / "model-00001-of-00002.safetensors")
    header_size = struct.unpack("<Q", (directory / "model-00001-of-00002.safetensors").read_bytes()[:8])[0]
    names = json.loads((directory / "model-00001-of-00002.safetensors").read_bytes()[8 : 8 + header_size])
    weight_map = {name: f"model-0000{1 + i % 2}-of-00002.safetensors" for i, name in enumerate(sorted(names))}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _remote_code(directory: Path) -> None:
    config = json.loads((directory / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel"}
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "modeling_evil.py").write_text(f"open({str(directory / 'RAN')!r}, 'w').close()\n")


CHECKPOINTS = [
    ("no config.json", lambda d: (d / "config.json").unlink(),
     "model directory {d!r} has no config.json (not a Hugging Face model directory)"),
    ("config.json not JSON", lambda d: (d / "config.json").write_text("{model_type: qwen3"),
     "model directory {d!r}: config.json is not readable JSON (Expecting property name enclosed in double quotes: "
     "line 1 column 2 (char 1))"),
    ("config.json a list", lambda d: (d / "config.json").write_text("[]"),
     "model directory {d!r}: config.json is not a JSON object"),
    ("no weights", lambda d: (d / "model.safetensors").unlink(),
     "model directory {d!r} has no weights (model.safetensors or model.safetensors.index.json)"),
    ("truncated weights", _truncate,
     "model directory {d!r}: model.safetensors is truncated ({size} bytes, its header needs {full})"),
    ("weights of 3 bytes", lambda d: (d / "model.safetensors").write_bytes(b"abc"),
     "model directory {d!r}: model.safetensors is truncated or not a safetensors file (3 bytes)"),
    ("corrupt header", _corrupt_header,
     "model directory {d!r}: model.safetensors is corrupt (its header is not valid safetensors JSON)"),
    ("missing shard", _shard,
     "model directory {d!r}: shard model-00002-of-00002.safetensors listed in model.safetensors.index.json is missing"),
    ("no tokenizer", lambda d: [(d / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")],
     "model directory {d!r} has no tokenizer (tokenizer.json, tokenizer.model, spiece.model, vocab.json, vocab.txt)"),
    ("remote code", _remote_code,
     "model directory {d!r} needs its own Python code (auto_map in config.json); minirl does not run it unless "
     "model.trust_remote_code=true (only for code you trust)"),
]


@pytest.mark.parametrize("case, damage, message", CHECKPOINTS, ids=[c[0] for c in CHECKPOINTS])
def test_bad_checkpoint_is_refused(checkpoint: Path, tmp_path: Path, case: str, damage, message: str) -> None:
    directory = _copy(checkpoint, tmp_path)
    full = (directory / "model.safetensors").stat().st_size
    damage(directory)
    size = (directory / "model.safetensors").stat().st_size if (directory / "model.safetensors").exists() else 0
    with pytest.raises(ModelLoadError) as error:
        load_model_and_tokenizer(str(directory))
    assert str(error.value) == message.format(d=str(directory), size=size, full=full)
    assert not (directory / "RAN").exists()


class _Payload:
    """Unpickling this runs code (touches a file): what a malicious pytorch_model.bin does."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self):
        return (Path.touch, (self.sentinel,))


def _write_malicious_bin(directory: Path) -> Path:
    import pickle

    sentinel = directory / "PWNED"
    (directory / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(sentinel)))
    return sentinel


def test_pickle_only_checkpoint_is_refused_unopened(checkpoint: Path, tmp_path: Path) -> None:
    directory = _copy(checkpoint, tmp_path)
    (directory / "model.safetensors").unlink()
    sentinel = _write_malicious_bin(directory)
    with pytest.raises(ModelLoadError) as error:
        load_model_and_tokenizer(str(directory))
    assert str(error.value) == (
        f"model directory {str(directory)!r} has weights only as a pickle file (pytorch_model.bin), which can run "
        "code when loaded; minirl loads safetensors only: convert it with save_pretrained(dir, safe_serialization=True)"
    )
    assert not sentinel.exists()


def test_safetensors_are_loaded_even_next_to_a_pickle(checkpoint: Path, tmp_path: Path) -> None:
    directory = _copy(checkpoint, tmp_path)
    sentinel = _write_malicious_bin(directory)
    model, _ = load_model_and_tokenizer(str(directory))
    assert not sentinel.exists() and model.config.model_type == "qwen3_moe"


def test_sharded_checkpoint_with_all_shards_passes_the_checks(checkpoint: Path, tmp_path: Path) -> None:
    from minirl.models.io import check_model_directory

    directory = _copy(checkpoint, tmp_path)
    _shard(directory)
    shutil.copy(directory / "model-00001-of-00002.safetensors", directory / "model-00002-of-00002.safetensors")
    check_model_directory(directory)


def test_checkpoint_of_another_model_is_refused(checkpoint: Path, tmp_path: Path) -> None:
    model, _ = load_model_and_tokenizer("qwen3-moe-tiny", seed=1)
    check_compatible(checkpoint, model.config)  # same architecture, other weights: fine
    check_compatible(checkpoint, model)

    other = _copy(checkpoint, tmp_path)
    config = json.loads((other / "config.json").read_text())
    expected_vocab, expected_hidden = config["vocab_size"], config["hidden_size"]
    config.update(vocab_size=expected_vocab + 50, hidden_size=2 * expected_hidden)
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError) as error:
        check_compatible(other, model.config)
    assert str(error.value) == (
        f"checkpoint {str(other)!r} is from another model: vocab_size {expected_vocab + 50} (expected {expected_vocab}), "
        f"hidden_size {2 * expected_hidden} (expected {expected_hidden})"
    )


def test_checkpoint_of_another_architecture_is_refused(checkpoint: Path) -> None:
    dense, _ = load_model_and_tokenizer("qwen3-dense-2m")
    with pytest.raises(ModelLoadError) as error:
        check_compatible(checkpoint, dense.config.to_dict())
    message = str(error.value)
    assert message.startswith(f"checkpoint {str(checkpoint)!r} is from another model: model_type 'qwen3_moe' (expected 'qwen3')")
    assert "\n" not in message and "hidden_size" in message


def test_checkpoint_without_config_is_refused_by_check_compatible(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as error:
        check_compatible(tmp_path, {"vocab_size": 3})
    assert str(error.value) == f"model directory {str(tmp_path)!r} has no config.json (not a Hugging Face model directory)"


def test_corpus_is_large_enough() -> None:
    corpora = (CONFIG_FILES, OVERRIDES, BAD_ROWS, FILE_ERRORS, SPECS, BAD_FUNCTIONS, WORKER_ONLY, CHECKPOINTS)
    assert sum(map(len, corpora)) >= 40  # plus the single cases above


def test_bad_checkpoint_via_the_cli(capsys: pytest.CaptureFixture, checkpoint: Path, tmp_path: Path) -> None:
    directory = _copy(checkpoint, tmp_path)
    _truncate(directory)
    message = cli_error(capsys, "eval", "--config", str(MINIMAL), str(directory))
    assert message.startswith(f"model directory {str(directory)!r}: model.safetensors is truncated (")
