"""slime's ``--rm-type remote_rm``: each response POSTed to the user's reward server at ``--rm-url`` as slime posts it,
retried as slime retries, its JSON answer the reward (or a dict read at ``--reward-key``)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from minirl.tasks import slime_rewards
from minirl.tasks.reward_functions import Sample, make_reward_fn


@pytest.fixture
def server():
    """A local reward server: 1.0 when the response holds the label, answered as {"score": ..., "len": ...}; the first
    ``fail_first`` requests get HTTP 503."""
    state = {"posted": [], "fail_first": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # http.server calls it by this name
            payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state["posted"].append(payload)
            if len(state["posted"]) <= state["fail_first"]:
                self.send_response(503)
                self.end_headers()
                return
            body = json.dumps({"score": float(str(payload["label"]) in payload["response"]),
                               "len": len(payload["response"])}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    state["url"] = f"http://127.0.0.1:{httpd.server_address[1]}/reward"
    yield state
    httpd.shutdown()


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
    with pytest.raises(RuntimeError, match=r"^remote_rm: http://127\.0\.0\.1:\d+/reward failed 3 times, last: HTTP Error 503"):
        slime_rewards.remote_rm(args, sample, max_retries=3, sleep=waits.append)
    assert len(server["posted"]) == 3
    with pytest.raises(ValueError, match=r"^rm_type remote_rm: set --rm-url"):
        slime_rewards.remote_rm(SimpleNamespace(rm_url=None), sample)
