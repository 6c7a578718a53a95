"""Issue 21's corpus: each input that used to crash, hang or lose work now ends in one line without a
traceback, with the documented exit code, and loses nothing (the last checkpoint verifies, the
metrics hold each step once). Rows of the issue's table and its "Also seen" list, in order;
the killed-before-the-first-checkpoint, non-finite-weights and damaged-checkpoint rows are in
``tests/resume`` (test_resume_before_checkpoint, test_poisoned_weights, test_checksums)."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minirl import checkpoint
from minirl.cli import main
from minirl.tasks import JsonlTask, TaskDataError
from minirl.types import Prompt
from tests.resume.test_exact_resume import ROOT, TINY, _env

CORPUS = Path(__file__).parent / "corpus"
MINIMAL = CORPUS / "minimal.yaml"


def one_line(err: str, prefix: str = "minirl: error: ") -> str:
    """The single ``minirl:`` line of ``err`` (no traceback anywhere); returns its message."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("minirl:")]
    assert len(lines) == 1 and lines[0].startswith(prefix), err
    return lines[0][len(prefix):]


def _args(tmp_path: Path, steps: int, *more: str) -> list[str]:
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    return ["train", "configs/demo.yaml", *overrides, f"optim.global_steps={steps}", "run.overwrite=false",
            f"run.output_dir={tmp_path}", "run.name=r", *more]


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _nothing_lost(run: Path, last_step: int) -> None:
    """The newest checkpoint is step ``last_step`` and verifies; metrics hold each step once."""
    path, meta = checkpoint.find_latest(run)
    assert meta["step"] == last_step and checkpoint.verify(path) is None
    steps = _steps(run)
    assert len(steps) == len(set(steps)) and steps[: last_step + 1] == list(range(last_step + 1))


# --- inputs refused before any work (exit 2) ------------------------------------------------------

def test_a_30_mb_row_is_refused_without_tokenizing_it(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text('{"prompt": "2+2?", "answer": "4"}\n' + json.dumps({"prompt": "x" * 30_000_000, "answer": "1"}) + "\n")

    def count_tokens(prompt: Prompt) -> int:  # JsonlTask counts a Prompt's tokens (a chat is rendered first)
        assert len(prompt.text) < 1_000_000, "the 30 MB row was tokenized"
        return len(prompt.text)

    with pytest.raises(TaskDataError) as error:
        JsonlTask(path, max_prompt_tokens=480, count_tokens=count_tokens)
    assert str(error.value) == (f"{path}:2: prompt is 30000000 characters, more than 480 tokens could hold (at most 64 "
                                "characters a token; task.max_prompt_tokens, or the model's context less "
                                "rollout.max_new_tokens)")


def test_a_30_mb_row_via_the_cli(tmp_path, capsys):
    path = tmp_path / "big.jsonl"
    path.write_text('{"prompt": "2+2?", "answer": "4"}\n' * 4 + json.dumps({"prompt": "x" * 30_000_000, "answer": "1"}) + "\n")
    code = main(["eval", "--config", str(MINIMAL), "qwen3-moe-tiny", "task.kind=jsonl", f"task.path={path}"])
    assert code == 2
    assert one_line(capsys.readouterr().err).startswith(f"{path}:5: prompt is 30000000 characters, more than ")


def test_a_one_row_dataset(tmp_path, capsys):
    path = tmp_path / "one.jsonl"
    path.write_text('{"prompt": "2+2?", "answer": "4"}\n')
    assert main(_args(tmp_path, 1, "task.kind=jsonl", f"task.path={path}", "task.reward_function=null")) == 2
    assert one_line(capsys.readouterr().err) == (
        f"{path}: 1 row: none left for evaluation (task.eval_fraction 0.1); add rows or give task.eval_path")


SIZES = [
    ("rollout.max_new_tokens=1000000000",
     "rollout.max_new_tokens: 1000000000 new tokens do not fit the model's context of 512 tokens "
     "(max_position_embeddings; a prompt needs at least one): at most 511"),
    ("eval.max_new_tokens=512", "eval.max_new_tokens: 512 new tokens do not fit the model's context of 512 tokens "),
    # the 1e6 prompts needs ~33 GiB with these sizes: refused here, not on a larger machine; 1e9 anywhere
    ("rollout.prompts_per_step=1000000000", "rollout.prompts_per_step: a step's rollout needs at least "),
    # dynamic sampling's rounds of rollout.filter_groups_prompts_per_round prompts are what must fit
    ("rollout.filter_groups=true rollout.filter_groups_prompts_per_round=1000000000",
     "rollout.filter_groups_prompts_per_round: a step's rollout needs at least "),
]


@pytest.mark.parametrize("override, message", SIZES)
def test_absurd_sizes_are_refused_before_any_work(tmp_path, capsys, override, message):
    assert main(_args(tmp_path, 1, "cold_start.enabled=true", *override.split())) == 2
    assert one_line(capsys.readouterr().err).startswith(message)
    assert not (tmp_path / "r" / "sft").exists() and not (tmp_path / "r" / "metrics.jsonl").exists()


def test_every_config_decided_mistake_is_said_at_once(tmp_path, capsys):
    """A run meeting a new machine learns all it must change in one go: one line per mistake the config decides."""
    assert main(_args(tmp_path, 1, "rollout.max_new_tokens=1000000000", "eval.max_new_tokens=512")) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("minirl:")]
    assert [line.split(":")[2].strip() for line in lines] == ["rollout.max_new_tokens", "eval.max_new_tokens"]
    assert all(line.startswith("minirl: error: ") for line in lines)


def test_a_latin1_config_file(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("run:\n  name: caf\xe9\n".encode("latin-1"))
    assert main(["train", str(path)]) == 2
    assert one_line(capsys.readouterr().err) == f"{path}:2: not valid UTF-8 (byte 16: 0xe9); save the config file as UTF-8"


def test_a_run_directory_under_a_regular_file(tmp_path, capsys):
    (tmp_path / "file").write_text("not a directory")
    assert main(_args(tmp_path / "file" / "runs", 1)) == 2
    assert one_line(capsys.readouterr().err) == (
        f"run.output_dir: {tmp_path / 'file'} is a file, not a directory, so the run directory "
        f"{tmp_path / 'file' / 'runs' / 'r'} cannot be made there; choose another run.output_dir")


@pytest.fixture
def read_only_dir(tmp_path, monkeypatch):
    """A read-only directory: a read-only tmpfs where this process may mount one (root ignores
    file modes), else a directory whose writes fail with EROFS."""
    path = tmp_path / "ro"
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], capture_output=True).returncode == 0
    if not mounted:
        import tempfile

        real = tempfile.TemporaryFile

        def read_only(*args, **kwargs):
            if str(kwargs.get("dir", "")).startswith(str(path)):
                raise OSError(errno.EROFS, "Read-only file system")
            return real(*args, **kwargs)

        monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
        (path / "r").mkdir()
    yield path
    if mounted:
        subprocess.run(["umount", str(path)], check=False)


def test_a_read_only_run_directory(read_only_dir, capsys):
    assert main(_args(read_only_dir, 1)) == 2
    message = one_line(capsys.readouterr().err)
    assert message.startswith("run.output_dir: cannot ") and "Read-only file system" in message, message


# --- failures during a run: one line, nothing lost ------------------------------------------------

def test_a_reward_that_overflows_float32(tmp_path, capsys, monkeypatch):
    args = _args(tmp_path, 2, "task.reward_function=tests.robustness.bad_rewards:huge_when_asked")
    assert main(args) == 0
    monkeypatch.setenv("MINIRL_TEST_HUGE_REWARD", "1")
    capsys.readouterr()
    assert main([*args[:-4], "optim.global_steps=4", *args[-3:], "--resume"]) == 2
    assert one_line(capsys.readouterr().err) == (
        "reward function tests.robustness.bad_rewards:huge_when_asked returned 1e+300, which overflows float32 "
        "(|reward| must be at most 3.403e+38)")
    _nothing_lost(tmp_path / "r", 2)


def test_a_full_disk_while_writing_a_checkpoint(tmp_path, capsys, monkeypatch):
    real_save = checkpoint.torch.save
    calls = {"n": 0}

    def full_disk(obj, path, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # step 2's checkpoint: half written, then the disk is full
            Path(path).write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    args = _args(tmp_path, 3)
    assert main(args) == 2
    message = one_line(capsys.readouterr().err)
    run = tmp_path / "r"
    assert message.startswith("cannot write ") and "trainer_state.pt: No space left on device; the last complete " \
        f"checkpoint is {run / 'checkpoints' / 'step_000001'}; resume with: minirl train configs/demo.yaml " in message
    assert message.endswith(" --resume")
    assert not [p for p in os.listdir(run / "checkpoints") if ".tmp-" in p]  # the partial copy was removed
    _nothing_lost(run, 1)
    monkeypatch.setattr(checkpoint.torch, "save", real_save)  # space freed: the printed command resumes
    assert main([*args, "--resume"]) == 0
    assert _steps(run) == [0, 1, 2, 3]


# --- signals ---------------------------------------------------------------------------------------

def _interrupted(tmp_path: Path, command: list[str], signal_number: int, after_lines: int) -> subprocess.CompletedProcess:
    run = tmp_path / "r"
    proc = subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # its own process group: the signal reaches it like a terminal's
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        if (run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_bytes().count(b"\n") >= after_lines:
            os.killpg(proc.pid, signal_number)
            break
        time.sleep(0.01)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(command, proc.returncode, out.decode(), err.decode())


@pytest.mark.parametrize("signal_number", [pytest.param(signal.SIGINT, marks=pytest.mark.slow), signal.SIGTERM])  # one path
def test_a_signal_during_training_ends_in_one_line_naming_the_checkpoint_and_the_resume_command(tmp_path, signal_number):
    command = [sys.executable, "-m", "minirl.cli", *_args(tmp_path, 8)]
    result = _interrupted(tmp_path, command, signal_number, after_lines=4)
    name = signal.Signals(signal_number).name
    assert result.returncode == 128 + signal_number, result.stderr[-3000:]
    message = one_line(result.stderr, prefix=f"minirl: {name}: stopped; ")
    run = tmp_path / "r"
    path, meta = checkpoint.find_latest(run)
    assert message.startswith(f"the last complete checkpoint is {path}; resume with: minirl train configs/demo.yaml ")
    assert message.endswith(" --resume") and checkpoint.verify(path) is None
    assert _steps(run)[: meta["step"] + 1] == list(range(meta["step"] + 1))
    resumed = subprocess.run([sys.executable, "-m", "minirl.cli", *_args(tmp_path, 8), "--resume"], cwd=ROOT, env=_env(),
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _steps(run) == list(range(9))


def test_the_resume_command_keeps_the_start_and_the_rollout_flags(tmp_path):
    # with no checkpoint yet, a resume starts over: from the --start-from checkpoint, not from the config's model
    import argparse

    from minirl.cli import _resume_hint
    from minirl.config import load_config

    cfg = load_config(None, [f"run.output_dir={tmp_path}"])
    args = argparse.Namespace(command="train", config="config.yaml", overrides=["optim.global_steps=3"], resume=False,
                              start_from="runs/my sft", dump_rollouts="dump", rollouts_from=None)
    assert _resume_hint(cfg, args) == ("no checkpoint was completed (a resume starts from step 0); resume with: minirl "
                                       "train config.yaml optim.global_steps=3 --start-from 'runs/my sft' "
                                       "--dump-rollouts dump --resume")


@pytest.mark.parametrize("every", [0, 1])
def test_a_signal_during_sft_ends_in_one_line(tmp_path, every):
    """Without cold_start.checkpoint_every_steps nothing is kept; with it, the line names the state kept and the step."""
    overrides = [o for o in TINY if not o.startswith("cold_start.")]
    output = tmp_path / "sft"
    command = [sys.executable, "-m", "minirl.cli", "sft", "configs/demo.yaml", *overrides, "cold_start.steps=100000",
               "cold_start.batch_sequences=4", f"cold_start.checkpoint_every_steps={every}", f"run.output_dir={tmp_path}",
               "run.name=r", "--output", str(output)]
    proc = subprocess.Popen(command, cwd=ROOT, env={**_env(), "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        first = proc.stdout.readline()  # the first progress line: SFT is running
        assert b"sft step 1/" in first, first
        time.sleep(1.0 if every else 0.0)  # some steps, each keeping its state
        os.killpg(proc.pid, signal.SIGINT)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err.decode()[-3000:]
    said = one_line(err.decode(), prefix="minirl: SIGINT: stopped; ")
    if not every:
        assert said == (f"no SFT state was kept in {output} (cold_start.checkpoint_every_steps: 0), it starts again "
                        "from step 1; run the same command again")
        assert not output.exists()
    else:
        assert re.fullmatch(rf"the SFT's state after step \d+ is in {re.escape(str(output / 'sft_state.pt'))}, the same "
                            r"command continues from it; run the same command again", said), said


SECOND_SIGNAL = """
import os, signal, sys, time
from minirl.cli import Interrupted, stop_on_signals
with stop_on_signals():
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    except Interrupted:
        print("unwinding", flush=True)
        os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C while the run unwinds
        time.sleep(5)
        print("not reached", flush=True)
"""


def test_a_second_ctrl_c_exits_at_once():
    result = subprocess.run([sys.executable, "-c", SECOND_SIGNAL], cwd=ROOT, env=_env(), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 130 and result.stdout == "unwinding\n", result
    assert result.stderr == "minirl: SIGINT again: exiting now\n"


# --- checks before working: the config alone decides (vLLM is not installed here and not needed) ---

BEFORE_WORK = [
    (["cluster.engine_backend=vllm", "moe.routing_replay=R3"],
     "moe.routing_replay=R3, moe.routing_metrics=true: vLLM returns routed experts only with Model Runner V2 on a CUDA "
     "GPU, which this machine lacks; set moe.routing_metrics=false (and no R3) or use cluster.engine_backend=native"),
    (["cluster.engine_backend=vllm", "moe.routing_replay=none", "moe.routing_metrics=true"],
     "moe.routing_replay=none, moe.routing_metrics=true: vLLM returns routed experts only "),
    (["cluster.engine_backend=vllm", "rollout.precision=fp8_e5m2"],
     "rollout.precision: fp8_e5m2 has no vLLM switch; use fp32, bf16, fp16, fp8_e4m3 with engine_backend=vllm, "
     "or engine_backend=native"),
    (["cluster.device=cuda"], "cluster.device: cuda is not available on this machine; use cpu"),
    (["cluster.backend=ray", "cluster.cpus_per_engine=4096"],
     "cluster.cpus_per_engine: 1 engines and 1 trainer ranks reserve 4097 CPUs and 0 GPUs but the Ray instance "
     "started here would have this machine's "),
]


# every case in one fresh process, one after another (a process imports torch and transformers in ~7 s here): after
# each, its exit code and whether vLLM, Ray or the SFT code had been imported by then (a case that imports one fails,
# and every case after it); its stderr ends at a marker line
BEFORE_WORK_SCRIPT = """
import json, sys
from minirl.cli import main
for argv in json.loads(sys.argv[1]):
    code = main(argv)
    print(json.dumps([code, *(name in sys.modules for name in ("vllm", "ray", "minirl.sft"))]), flush=True)
    print("--- end of case ---", file=sys.stderr, flush=True)
"""


@pytest.fixture(scope="module")
def before_work(tmp_path_factory):
    """(stdout line, stderr, run directory) of each ``BEFORE_WORK`` case, run in one process."""
    base = tmp_path_factory.mktemp("before_work")
    argvs = [_args(base / str(case), 1, "cold_start.enabled=true", *overrides)
             for case, (overrides, _) in enumerate(BEFORE_WORK)]
    result = subprocess.run([sys.executable, "-c", BEFORE_WORK_SCRIPT, json.dumps(argvs)], cwd=ROOT, env=_env(),
                            capture_output=True, text=True, timeout=300)
    outs, errs = result.stdout.splitlines(), result.stderr.split("--- end of case ---\n")
    assert result.returncode == 0 and len(outs) == len(BEFORE_WORK), result
    return [(json.loads(out), err, base / str(case) / "r") for case, (out, err) in enumerate(zip(outs, errs))]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks what a CPU-only machine refuses")
@pytest.mark.parametrize("case", range(len(BEFORE_WORK)), ids=[" ".join(overrides) for overrides, _ in BEFORE_WORK])
def test_config_decided_checks_run_before_the_cold_start(before_work, case):
    status, err, run = before_work[case]
    assert status == [2, False, False, False], err  # refused, nothing imported, nothing built
    assert one_line(err).startswith(BEFORE_WORK[case][1])
    assert not (run / "sft").exists()


def test_vllm_v2_runner_hint_without_a_gpu(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert main(_args(tmp_path, 1, "cluster.engine_backend=vllm", "moe.routing_metrics=false")) == 2
    assert one_line(capsys.readouterr().err) == (
        "VLLM_USE_V2_MODEL_RUNNER=1: vLLM's Model Runner V2 needs Triton on a CUDA GPU and there is none here; "
        "unset it (routed experts then need engine_backend=native)")


def test_a_vllm_configuration_error_is_one_line(monkeypatch):
    """vLLM's pydantic ValidationError (a ValueError) becomes vLLM's own reason in one line (fake vLLM:
    it is not installed here)."""
    import types

    from minirl.config import ConfigError
    from minirl.rollout.vllm_engine import VLLMEngine

    class LLM:
        def __init__(self, **kwargs):
            raise ValueError("1 validation error for VllmConfig\n  Value error, Model Runner V2 requires Triton "
                             "[type=value_error, input_value=ArgsKwargs((), {}), input_type=ArgsKwargs]")

    platforms = types.SimpleNamespace(current_platform=types.SimpleNamespace(is_cpu=lambda: False))
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM))
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    tokenizer = types.SimpleNamespace(eos_token_id=1)
    with pytest.raises(ConfigError) as error:
        VLLMEngine("/nowhere", None, tokenizer)
    assert str(error.value) == "cluster.engine_backend: vLLM refused its configuration: Model Runner V2 requires Triton"


def test_lora_without_peft_is_one_line_before_any_work(tmp_path, monkeypatch):
    import importlib.util

    from minirl.config import ConfigError, load_config
    from minirl.preflight import preflight

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    cfg = load_config(None, [f"run.output_dir={tmp_path}", "model.lora.rank=4"])
    with pytest.raises(ConfigError) as error:
        preflight(cfg)
    assert str(error.value) == ("model.lora: LoRA needs the peft package, which is not installed; "
                                "pip install 'minirl[lora]' (or peft)")
