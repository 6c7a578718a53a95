"""OpenRLHF's reward server (``--remote_rm_url http://...``), as a minirl reward function.

``remote_rm(queries, prompts, labels, *, url)`` is called with OpenRLHF's convention
(``minirl.tasks.reward_functions``, ``convention: openrlhf``): one call a step, with each response's query (its prompt's
text followed by the response), prompt and label. It POSTs ``{"query": queries, "prompts": prompts, "labels": labels}``
as JSON to ``url`` and returns the answer's ``score_key`` list (``rewards``), as OpenRLHF's ``remote_rm_fn`` does
(``openrlhf/utils/remote_rm_utils.py``): up to ``tries`` requests (5), each within ``timeout_s`` (180 s), 1 s apart. What
``minirl config from-openrlhf`` writes for an HTTP ``--remote_rm_url``.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any


def remote_rm(queries: list[str], prompts: list[str], labels: list[Any], *, url: str, score_key: str = "rewards",
              tries: int = 5, timeout_s: float = 180.0, sleep: Callable[[float], None] | None = None) -> list[Any]:
    """The rewards the server at ``url`` answers for ``queries`` (its JSON's ``score_key`` entry, one per query); a
    server that fails every try is one line naming it, the last failure and the tries."""
    body = json.dumps({"query": queries, "prompts": prompts, "labels": labels}, default=str).encode()
    failure = ""
    for attempt in range(tries):
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as answer:
                text = answer.read()
        except urllib.error.HTTPError as exc:  # the server is there and says no
            exc.close()
            failure = f"answers HTTP {exc.code} {exc.reason}"
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:  # nothing there, or no answer
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            failure = (f"no answer within {timeout_s:g} s" if isinstance(reason, TimeoutError)
                       else "unreachable: " + (" ".join(str(reason).split()) or type(reason).__name__))
        else:
            try:
                answered = json.loads(text)
            except ValueError:
                failure = f"answered {text[:60]!r}, not JSON"
            else:
                if isinstance(answered, dict) and score_key in answered:
                    return list(answered[score_key])
                keys = ", ".join(map(str, answered)) if isinstance(answered, dict) else type(answered).__name__
                failure = f"answered no {score_key!r} (OpenRLHF reads it; got {keys})"
        if attempt + 1 < tries:
            (sleep or time.sleep)(1.0)
    raise RuntimeError(f"remote_rm: the reward server at {url} (--remote_rm_url) {failure}, {tries} tries")
