"""slime's built-in ``--rm-type`` scorers (``slime/rollout/rm_hub``), as minirl reward functions: what
``minirl config from-slime`` writes for ``--rm-type dapo | math | deepscaler``.

Each is called the way verl calls a ``compute_score`` (``minirl.tasks.reward_functions``): the completion's text as
``solution_str`` and the row's answer (slime's label) as ``ground_truth``.

* ``dapo``: slime's ``math_dapo_utils.compute_score``, verl's ``math_dapo`` (``minirl.tasks.verl_scores.dapo_score``):
  Minerva's check of the last 300 characters, 1.0 / -1.0, with ``acc`` logged beside it (slime reads ``score`` with
  ``--reward-key score``).
* ``math``: slime's ``grade_answer_verl``: the last ``\\boxed{}`` answer of the response (and of the label, when it
  has one) against the label; 1 or 0, and 0 without a boxed answer or with an empty label.
* ``deepscaler``: the same on the text after the response's last ``</think>`` (else after its first ``###Response``);
  0 without either.

slime grades ``math`` and ``deepscaler`` with DeepScaleR's rules (``mathd`` normalisation, then sympy); these use
``math_verify`` (``minirl.tasks.jsonl.math_equivalent``): the same verdict on numbers and on most LaTeX answers, not on
every one. The translation says so in its header.
"""

from __future__ import annotations

from typing import Any

from minirl.tasks.jsonl import math_equivalent
from minirl.tasks.verl_scores import dapo_score, last_boxed, unbox


def dapo(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, Any]:
    """``--rm-type dapo``: 1.0 / -1.0 (and ``acc``)."""
    scored = dapo_score(solution_str, str(ground_truth))
    return {"score": scored["score"], "acc": float(scored["acc"])}


def math(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """``--rm-type math``: 1.0 when the response's last boxed answer equals the label, else 0.0."""
    return 1.0 if _boxed_matches(solution_str, ground_truth) else 0.0


def deepscaler(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """``--rm-type deepscaler``: ``math`` on what follows the response's last ``</think>`` (0.0 without one)."""
    if "</think>" in solution_str:
        solution = solution_str.split("</think>")[-1]
    elif "###Response" in solution_str:  # slime's: what follows the first marker, up to a second one
        solution = solution_str.split("###Response")[1]
    else:
        return 0.0
    return 1.0 if _boxed_matches(solution, ground_truth) else 0.0


def _boxed_matches(response: str, label: Any) -> bool:
    """slime's ``grade_answer_verl`` with ``math_verify`` as the judge."""
    label = "" if label is None else str(label)
    if not label:
        return False
    if "\\boxed" in label:
        boxed_label = last_boxed(label)
        label = unbox(boxed_label, spaced=False) if boxed_label is not None else label
    boxed = last_boxed(response)
    if boxed is None:
        return False
    return math_equivalent(unbox(boxed, spaced=False), label)
