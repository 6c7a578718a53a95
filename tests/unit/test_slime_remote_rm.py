"""slime's ``--rm-type remote_rm``: each response POSTed to the user's reward server at ``--rm-url`` as slime posts it,
retried as slime retries, its JSON answer the reward (or a dict read at ``--reward-key``)."""

from __future__ import annotations

import re
import socket
import threading
from http.server import ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from minirl.peers import from_slime
from minirl.tasks import build_task, slime_rewards
from minirl.tasks.reward_functions import Sample, make_reward_fn
from minirl.tasks.reward_runner import RewardRunner
from minirl.tasks.rewards import RewardFunctionError
from tests.unit.reward_server import serve


def _serve(state: dict, port: int = 0) -> ThreadingHTTPServer:
    """A local reward server on ``port`` (0: a free one): 1.0 when the response holds the label, answered as
    {"score": ..., "len": ...}; the first ``state["fail_first"]`` requests get HTTP 503."""
    return serve(state, lambda payload: {"score": float(str(payload["label"]) in payload["response"]),
                                         "len": len(payload["response"])}, port)


@pytest.fixture
def server():
    state = {"posted": [], "fail_first": 0}
    httpd = _serve(state)
    state["url"] = f"http://127.0.0.1:{httpd.server_address[1]}/reward"
    yield state
    httpd.shutdown()
    httpd.server_close()


def _free_port() -> int:
    """A port nothing listens on: bound, then closed (a connection to it is refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class _Clock:
    """A clock that only ``sleep`` moves: remote_rm's waits, without waiting."""

    def __init__(self) -> None:
        self.now, self.waits = 0.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def test_remote_rm_posts_prompt_response_and_label_and_reads_the_reward_key(server):
    fn = make_reward_fn(slime_rewards.rm_hub, kwargs={"rm_type": "remote_rm", "rm_url": server["url"],
                                                      "reward_key": "score"})
    samples = [Sample("What is 3 x 4?", "It is 12.", "12", [1]), Sample("What is 3 x 4?", "It is 13.", "12", [1])]
    assert fn.score(samples) == [1.0, 0.0]
    assert server["posted"][0] == {"prompt": "What is 3 x 4?", "response": "It is 12.", "label": "12"}
    assert fn.score(samples[:1])[0].extras == {"len": 9.0}  # the answer's other numbers, logged beside the reward
    boxed = make_reward_fn(slime_rewards.rm_hub, kwargs={"rm_type": "boxed_remote_rm", "rm_url": server["url"],
                                                         "reward_key": "score"})
    assert boxed.score([Sample("q", "So \\boxed{12}", "12", [1])]) == [1.0]
    assert server["posted"][-1]["response"] == "So \\boxed{12}"  # slime posts the whole response


def test_remote_rm_retries_as_slime_then_fails_in_one_line(server):
    waits: list[float] = []
    sample = SimpleNamespace(prompt="p", response="12", label="12", metadata={})
    server["fail_first"] = 2
    args = SimpleNamespace(rm_url=server["url"], rm_type="remote_rm")
    assert slime_rewards.remote_rm(args, sample, sleep=waits.append) == {"score": 1.0, "len": 2}
    assert len(waits) == 2 and 1 <= waits[0] < 2 and 2 <= waits[1] < 3  # min(2^attempt, 30) + up to 1 s
    server["fail_first"], server["posted"] = 100, []
    with pytest.raises(RuntimeError, match=r"^remote_rm: the reward server at http://127\.0\.0\.1:\d+/reward \(--rm-url\) "
                                           r"answers HTTP 503 Service Unavailable, 3 tries in \d+\.\d s$"):
        slime_rewards.remote_rm(args, sample, max_retries=3, sleep=waits.append)
    assert len(server["posted"]) == 3
    with pytest.raises(ValueError, match=r"^rm_type remote_rm: set --rm-url"):
        slime_rewards.remote_rm(SimpleNamespace(rm_url=None), sample)


def test_the_translated_budget_holds_slimes_whole_schedule(server):
    """Within the budget the translation gives (``rm_deadline_s``), a server that keeps failing gets slime's 10 tries
    and its back-off, min(2^attempt, 30) s + up to 1 s, before the one line."""
    clock, sample = _Clock(), SimpleNamespace(prompt="p", response="12", label="12", metadata={})
    server["fail_first"] = 100
    args = SimpleNamespace(rm_url=server["url"], rm_deadline_s=slime_rewards.SLIME_RM_DEADLINE_S)
    with pytest.raises(RuntimeError, match=r"answers HTTP 503 Service Unavailable, 10 tries in 1[56]\d\.\d s$"):
        slime_rewards.remote_rm(args, sample, sleep=clock.sleep, clock=clock)
    assert len(server["posted"]) == 10 and len(clock.waits) == 9
    assert all(min(2 ** k, 30) <= wait < min(2 ** k, 30) + 1 for k, wait in enumerate(clock.waits))
    assert clock.now < slime_rewards.SLIME_RM_DEADLINE_S < slime_rewards.SLIME_RM_TIMEOUT_S


def test_a_dead_server_is_one_line_naming_rm_url_within_the_budget():
    """Nothing listens at --rm-url: remote_rm retries while its budget allows (under the runner's 10 s default
    timeout), then says which URL, from which flag, and that the connection was refused, not an HTTP status."""
    clock, sample = _Clock(), SimpleNamespace(prompt="p", response="12", label="12", metadata={})
    url = f"http://127.0.0.1:{_free_port()}/reward"
    with pytest.raises(RuntimeError) as err:
        slime_rewards.remote_rm(SimpleNamespace(rm_url=url), sample, sleep=clock.sleep, clock=clock)
    tries = len(clock.waits) + 1
    assert re.fullmatch(rf"remote_rm: nothing answers at {re.escape(url)} \(--rm-url\): \[Errno \d+\] Connection refused, "
                        rf"{tries} tries in \d+\.\d s, stopped by its 9 s budget \(rm_deadline_s in its kwargs\)",
                        str(err.value)), str(err.value)
    assert tries in (3, 4) and clock.now < slime_rewards.REMOTE_RM_DEADLINE_S < 10.0  # the config's default timeout
    assert [min(2 ** k, 30) <= wait < min(2 ** k, 30) + 1 for k, wait in enumerate(clock.waits)] == [True] * (tries - 1)


def test_a_server_that_starts_late_is_waited_for():
    """One refused connection while the server starts: retried, as slime does, and then scored."""
    state, port, servers = {"posted": [], "fail_first": 0}, _free_port(), []
    args = SimpleNamespace(rm_url=f"http://127.0.0.1:{port}/reward")
    sample = SimpleNamespace(prompt="p", response="12", label="12", metadata={})
    assert slime_rewards.remote_rm(args, sample, sleep=lambda s: servers.append(_serve(state, port))) == \
        {"score": 1.0, "len": 2}
    assert len(servers) == 1 and len(state["posted"]) == 1
    servers[0].shutdown()
    servers[0].server_close()


def test_a_server_that_does_not_answer_is_cut_at_the_budget():
    """A server that takes the connection and never answers: no request outlasts the budget (slime's 120 s request
    timeout would pass the runner's). Called in a thread, so that a request that is not cut fails the test in 5 s."""
    said: list[str] = []

    def call() -> None:
        try:
            slime_rewards.remote_rm(SimpleNamespace(rm_url=url, rm_deadline_s=0.5), sample)
        except RuntimeError as exc:
            said.append(str(exc))

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/reward"
        sample = SimpleNamespace(prompt="p", response="12", label="12", metadata={})
        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        thread.join(5.0)
    assert re.fullmatch(rf"remote_rm: nothing answers at {re.escape(url)} \(--rm-url\): no answer within 0\.\d s, 1 try "
                        r"in 0\.\d s, stopped by its 0\.5 s budget \(rm_deadline_s in its kwargs\)",
                        said[0] if said else "no line after 5 s"), said


def test_the_run_sees_remote_rms_line_before_the_reward_timeout():
    """Through the reward runner (a worker process, ``task.reward_timeout_s`` 5 s): the run stops with remote_rm's
    line, not with the runner's generic "did not return within" one."""
    url = f"http://127.0.0.1:{_free_port()}/score"
    task = build_task("reverse", difficulty=2, num_train=2, num_eval=1, reward_functions=[
        {"function": "minirl.tasks.slime_rewards:rm_hub", "kwargs": {"rm_type": "remote_rm", "rm_url": url,
                                                                     "rm_deadline_s": 0.9}}])
    with RewardRunner(task, timeout_s=5.0) as runner, pytest.raises(RewardFunctionError) as err:
        runner.score(task.train_prompts(), [(0, "12")])
    assert re.fullmatch(rf"reward function minirl\.tasks\.slime_rewards:rm_hub raised RuntimeError: remote_rm: nothing "
                        rf"answers at {re.escape(url)} \(--rm-url\): \[Errno \d+\] Connection refused, 1 try in "
                        r"\d\.\d s, stopped by its 0\.9 s budget \(rm_deadline_s in its kwargs\)", str(err.value)), str(err.value)


def test_in_a_reward_worker_remote_rms_budget_follows_the_reward_timeout():
    """Without ``rm_deadline_s``, remote_rm in a reward worker keeps its tries within the runner's timeout less a second
    (here 3 s: a 2 s budget, not the 9 s it takes outside a worker), so its line still comes before the timeout's."""
    url = f"http://127.0.0.1:{_free_port()}/score"
    task = build_task("reverse", difficulty=2, num_train=2, num_eval=1, reward_functions=[
        {"function": "minirl.tasks.slime_rewards:rm_hub", "kwargs": {"rm_type": "remote_rm", "rm_url": url}}])
    with RewardRunner(task, timeout_s=3.0) as runner, pytest.raises(RewardFunctionError) as err:
        runner.score(task.train_prompts(), [(0, "12")])
    # (1 try when the first wait, 1-2 s, would itself reach the budget)
    assert re.search(r"remote_rm: nothing answers at .*, [12] tr(y|ies) in \d\.\d s, stopped by its 2 s budget",
                     str(err.value)), str(err.value)


def test_the_translation_gives_remote_rm_a_budget_under_the_reward_timeout():
    """``--rm-type remote_rm``: ``rm_deadline_s`` in the scorer's args, ``task.reward_timeout_s`` above it, and the
    header says so; the same when rows pick remote_rm by their metadata; other scorers keep the default timeout."""
    base = {"rollout-batch-size": 2, "n-samples-per-prompt": 4, "global-batch-size": 8}
    out = from_slime(base | {"rm-type": "remote_rm", "rm-url": "http://rm:8000/score"})
    kwargs = out.values["task.reward_functions"][0]["kwargs"]
    assert kwargs["rm_deadline_s"] == slime_rewards.SLIME_RM_DEADLINE_S < out.values["task.reward_timeout_s"]
    assert any("rm_deadline_s" in line and "--rm-url" in line and "task.reward_timeout_s" in line for line in out.differs)
    assert out.config().task.reward_timeout_s == slime_rewards.SLIME_RM_TIMEOUT_S
    rendered = out.render("run.sh")
    assert "reward_timeout_s: 180.0  # --rm-type remote_rm, --rm-url http://rm:8000/score: over remote_rm's " \
           "rm_deadline_s" in rendered
    assert "#   - --rm-type remote_rm, --rm-url http://rm:8000/score: remote_rm tries one response for at most 170 s" \
           in rendered
    rows = from_slime(base | {"rm-url": "http://rm:8000/score"})
    assert rows.values["task.reward_functions"][0]["kwargs"]["rm_deadline_s"] == slime_rewards.SLIME_RM_DEADLINE_S
    assert rows.values["task.reward_timeout_s"] == slime_rewards.SLIME_RM_TIMEOUT_S
    assert "task.reward_timeout_s" not in from_slime(base | {"rm-type": "dapo"}).values
    assert "rm_deadline_s" not in from_slime(base | {"rm-type": "dapo"}).values["task.reward_functions"][0]["kwargs"]
