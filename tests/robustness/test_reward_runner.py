"""RewardRunner: fallback accounting, worker replacement, threads, where rewards are computed,
and that no worker process outlives its trainer."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from functools import partial
from pathlib import Path

import pytest
import torch

from minirl.config import load_config
from minirl.tasks import (
    RewardFunctionError,
    RewardRunner,
    build_task,
    build_task_from_config,
    data_metrics,
    load_reward_function,
)
from minirl.types import Prompt
from tests.robustness import bad_rewards
from tests.robustness.bad_rewards import where_raised

ROOT = Path(__file__).resolve().parents[2]
BAD = "tests.robustness.bad_rewards"
PROMPTS = [Prompt(text="rev ab\n", answer="ba"), Prompt(text="rev xy\n", answer="yx")]


def _task(fn: object):
    return build_task("reverse", difficulty=2, num_train=2, num_eval=1, reward_function=fn)


def test_fallback_scores_problems_and_counts_them() -> None:
    completions = [(0, "ba"), (0, "boom"), (1, "yx"), (1, "nan"), (0, "loop"), (1, "crash"), (0, "ab")]
    task = _task(f"{BAD}:flaky")
    with RewardRunner(task, timeout_s=0.5, on_error="fallback", fallback_reward=-1.0) as runner:
        rewards, stats = runner.score(PROMPTS, completions)
        assert rewards.dtype == torch.float32 and rewards.tolist() == [1.0, -1.0, 1.0, -1.0, 0.0, 0.0, 0.0]
        assert stats == {"reward/errors": 2.0, "reward/timeouts": 0.0, "reward/fallback_frac": 2 / 7,
                         "reward/unscored_frac": 0.0, "reward/flaky/mean": 0.0}  # (1 - 1 + 1 - 1 + 0 + 0 + 0) / 7
        assert runner.last_problems == [
            f"reward function {BAD}:flaky raised RuntimeError: boom{where_raised('flaky')}",
            f"reward function {BAD}:flaky returned nan, expected a finite number",
        ]


@pytest.mark.parametrize("workers", [1, 2])
def test_hangs_and_crashes_are_replaced_workers_and_the_rest_is_scored(workers: int) -> None:
    # "loop" hangs (0.5 s, then killed); "crash" kills its worker; every other sample is scored.
    completions = [(0, "ba"), (0, "loop"), (1, "crash"), (1, "yx"), (0, "ab"), (1, "yx")]
    hangs_on_loop = partial(bad_rewards.hangs_on_loop)  # no spec: sent to the worker pickled
    task = _task(f"{BAD}:crashes_on_crash")
    with RewardRunner(task, timeout_s=0.5, on_error="fallback", fallback_reward=0.5, workers=workers) as runner:
        rewards, stats = runner.score(PROMPTS, completions)
        assert rewards.tolist() == [1.0, 0.0, 0.5, 1.0, 0.0, 1.0]  # "yx" after "crash" went to the new worker
        assert stats["reward/errors"] == 1.0 and stats["reward/timeouts"] == 0.0
    with RewardRunner(_task(hangs_on_loop), timeout_s=0.5, on_error="fallback", workers=workers) as runner:
        assert runner.in_worker
        started = time.monotonic()
        rewards, stats = runner.score(PROMPTS, [(0, "ba"), (0, "loop"), (1, "yx")])
        assert rewards.tolist() == [1.0, 0.0, 1.0] and stats["reward/timeouts"] == 1.0
        assert stats["reward/fallback_frac"] == pytest.approx(1 / 3)
        assert time.monotonic() - started < 3.0
        assert runner.score(PROMPTS, [(1, "yx")])[0].tolist() == [1.0]  # the replacement worker works


def test_timeout_works_off_the_main_thread() -> None:
    result: dict = {}

    def score() -> None:
        with RewardRunner(_task(f"{BAD}:hangs"), timeout_s=0.3) as runner:
            try:
                runner.score(PROMPTS, [(0, "ba")])
            except RewardFunctionError as error:
                result["error"] = str(error)

    thread = threading.Thread(target=score)
    thread.start()
    thread.join(timeout=10)
    assert result["error"] == (
        f"reward function {BAD}:hangs did not return within 0.3 s (task.reward_timeout_s); its worker process was killed"
    )


def test_where_rewards_are_computed() -> None:
    # A user function with a timeout: in a worker process (imported there from its spec).
    with RewardRunner(_task(f"{BAD}:worker_pid"), timeout_s=5.0, workers=2) as runner:
        pids = set(runner.score(PROMPTS, [(0, "a")] * 16)[0].tolist())
        assert os.getpid() not in pids and 1 <= len(pids) <= 2
    # Without a timeout, and for the built-in verifiers: here, with no worker at all.
    runner = RewardRunner(_task(f"{BAD}:worker_pid"), timeout_s=None)
    assert runner.score(PROMPTS, [(0, "a")])[0].tolist() == [float(os.getpid())]
    builtin = build_task("reverse", difficulty=2, num_train=2, num_eval=1)
    runner = RewardRunner(builtin, timeout_s=5.0, on_error="fallback")
    assert not runner.in_worker and runner._workers == []
    rewards, stats = runner.score(PROMPTS, [(0, "#### ba"), (1, "#### xx")])
    assert rewards.tolist() == [1.0, 0.0] and stats["reward/fallback_frac"] == 0.0


def test_a_reward_file_is_imported_from_its_spec_once_per_process(tmp_path: Path) -> None:
    log = tmp_path / "imports.log"
    module = tmp_path / "my_reward.py"
    module.write_text(textwrap.dedent(f"""
        import os
        with open({str(log)!r}, "a") as f:
            f.write(f"{{os.getpid()}}\\n")

        def score(prompt, completion, answer):
            raise KeyError(completion)
    """))
    task = _task(f"{module}:score")
    assert load_reward_function(f"{module}:score") is task.fn  # not executed again
    with RewardRunner(task, timeout_s=5.0, on_error="fallback") as runner:
        runner.score(PROMPTS, [(0, "a"), (1, "b")])
        assert runner.last_problems == [
            f"reward function {module}:score raised KeyError: 'a' (at {module}:7, in score)",  # the user's file and line
            f"reward function {module}:score raised KeyError: 'b' (at {module}:7, in score)",
        ]
        worker_pid = runner._workers[0].proc.pid
    assert log.read_text().split() == [str(os.getpid()), str(worker_pid)]


def test_runner_from_config_and_data_metrics(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "2+2?", "answer": "4"}\n{"prompt": "a much longer prompt", "answer": "x"}\n[]\n{"prompt": "3+3?", "answer": "6"}\n')
    cfg = load_config(None, [
        "task.kind=jsonl", f"task.path={data}", "task.on_bad_row=skip", "task.max_prompt_chars=10",
        "task.eval_fraction=0.5", f"task.reward_function={BAD}:flaky", "task.reward_on_error=fallback",
        "task.reward_fallback=-2", "task.reward_timeout_s=null",
    ])
    task = build_task_from_config(cfg.task)
    assert task.skipped_rows == 2 and data_metrics(task) == {"data/skipped_rows": 2.0}
    assert data_metrics(build_task("add", difficulty=1, num_train=3, num_eval=1)) == {"data/skipped_rows": 0.0}
    with RewardRunner.from_config(task, cfg.task) as runner:
        assert (runner.timeout_s, runner.on_error, runner.fallback_reward, runner.in_worker) == (None, "fallback", -2.0, False)
        assert runner.score(PROMPTS, [(0, "boom"), (0, "ba")])[0].tolist() == [-2.0, 1.0]


# --- processes: nothing left behind, no tracebacks -------------------------------------------------


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


ORPHAN_SCRIPT = f"""
import sys, threading, time
from types import SimpleNamespace
sys.path.insert(0, {str(ROOT)!r})
from minirl.tasks.reward_runner import RewardRunner
from minirl.tasks.rewards import CustomRewardTask
assert "torch" not in sys.modules  # the runner and the user-function wrapper import no torch
task = CustomRewardTask(SimpleNamespace(name="t"), "{BAD}:hangs")
runner = RewardRunner(task, timeout_s=60.0)
prompt = SimpleNamespace(text="p", answer="a")
threading.Thread(target=runner.score, args=([prompt], [(0, "x")]), daemon=True).start()
while not (runner._workers and runner._workers[0].ready and runner._workers[0].in_flight):
    time.sleep(0.01)  # until the sample is sent: the worker then spins forever
print(runner._workers[0].proc.pid, flush=True)
sys.stdin.readline()
if sys.argv[1] == "exit":
    sys.exit(0)
time.sleep(60)
"""


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_no_worker_outlives_the_trainer(how: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", ORPHAN_SCRIPT, how], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)
    worker = int(proc.stdout.readline())
    assert not _gone(worker, 0.1)  # busy in its infinite loop
    if how == "sigkill":
        proc.send_signal(signal.SIGKILL)
    else:
        proc.stdin.write("\n")
        proc.stdin.flush()
    assert proc.wait(timeout=20) == (0 if how == "exit" else -signal.SIGKILL)
    try:
        assert _gone(worker, 5.0)
    finally:
        if not _gone(worker, 0.0):
            os.kill(worker, signal.SIGKILL)


def test_workers_stop_when_the_runner_is_garbage_collected() -> None:
    runner = RewardRunner(_task(f"{BAD}:good"), timeout_s=5.0)
    runner.score(PROMPTS, [(0, "ba")])
    worker = runner._workers[0].proc.pid
    del runner
    gc.collect()
    assert _gone(worker, 0.3)


def test_cli_user_error_prints_one_line_and_no_traceback(tmp_path: Path) -> None:
    data = ROOT / "tests/robustness/corpus/not_json.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "minirl.cli", "eval", "qwen3-moe-tiny", "task.kind=jsonl", f"task.path={data}",
         f"run.output_dir={tmp_path}"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert (proc.returncode, proc.stdout) == (2, "") and "Traceback" not in proc.stderr
    assert proc.stderr == (
        f"minirl: error: {data}:2: not valid JSON (Expecting property name enclosed in double quotes at column 2)\n"
    )


def test_several_functions_batched_and_async_keep_timeouts_and_fallback() -> None:
    # a per-sample sync function, an async one that sleeps past the timeout, a batched one that
    # hangs (its one call times out for all the samples it held) and a batched one that raises
    functions = [{"function": f"{BAD}:good", "weight": 1.0}, {"function": f"{BAD}:sleeps_async", "weight": 2.0},
                 {"function": f"{BAD}:hangs_batched", "weight": 3.0}, {"function": f"{BAD}:raises_batched", "weight": 4.0}]
    task = build_task("reverse", difficulty=2, num_train=2, num_eval=1, reward_functions=functions)
    with RewardRunner(task, timeout_s=0.5, on_error="fallback", fallback_reward=-1.0, workers=2) as runner:
        rewards, stats = runner.score(PROMPTS, [(0, "ba"), (1, "xx")])
    # good: 1 and 0; every other function: its fallback -1, weighted 2 + 3 + 4 = 9
    assert rewards.tolist() == [1.0 - 9.0, 0.0 - 9.0]
    assert stats["reward/timeouts"] == 4.0 and stats["reward/errors"] == 2.0 and stats["reward/fallback_frac"] == 6 / 8
    assert stats["reward/good/mean"] == 0.5 and stats["reward/hangs_batched/mean"] == -1.0
    assert (f"reward function {BAD}:raises_batched raised ValueError: batched verifier broke"
            f"{where_raised('raises_batched')}") in runner.last_problems
    with RewardRunner(build_task("reverse", difficulty=2, num_train=2, num_eval=1, reward_functions=functions[2:3]),
                      timeout_s=0.3) as runner, pytest.raises(RewardFunctionError) as error:
        runner.score(PROMPTS, [(0, "ba")])
    assert str(error.value) == (f"reward function {BAD}:hangs_batched did not return within 0.3 s (task.reward_timeout_s); "
                                "its worker process was killed")
