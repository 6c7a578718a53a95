"""minirl's rewrite of verl's default rewards (``verl.utils.reward_score``, verl 0.9.1): gsm8k's, MATH's and DAPO's
scorers by ``data_source``, on cases computed by hand. (Checked against verl 0.9.1's own functions on 350,000
generated strings when written: no difference; `python scripts/compare_verl_scores.py VERL_REWARD_SCORE_DIR`.)"""

from __future__ import annotations

import pytest

from minirl.tasks.reward_functions import make_reward_fn
from minirl.tasks.verl_scores import (
    dapo_score,
    default_compute_score,
    gsm8k_answer,
    gsm8k_score,
    math_equivalent,
    math_normalize,
    math_score,
    minerva_normalize,
)


def test_gsm8k_reads_the_last_marked_number_of_the_tail():
    assert gsm8k_score("so 3 + 4 = 7\n#### 7", "7") == 1.0
    assert gsm8k_score("#### 1,234", "1234") == 1.0 and gsm8k_score("#### $5", "5") == 0.0  # "$5" never matches
    assert gsm8k_score("#### 8", "7") == 0.0 and gsm8k_score("the answer is 7", "7") == 0.0
    assert gsm8k_score("#### 7" + "x" * 300, "7") == 0.0  # only the last 300 characters are read
    assert gsm8k_answer("a 3, then 4.", "flexible") == "4." and gsm8k_answer("only . here", "flexible") == "."


@pytest.mark.parametrize("given, expected", [
    ("\\dfrac{1}{2}", "\\frac{1}{2}"), ("0.5", "\\frac{1}{2}"), ("1/2", "\\frac{1}{2}"), ("\\frac12", "\\frac{1}{2}"),
    ("x = 3", "3"), ("3\\text{ cm}", "3"), ("10\\%", "10"), ("\\sqrt2", "\\sqrt{2}"), (".5", "\\frac{1}{2}"),
    ("90^\\circ", "90"), ("\\left( 1, 2 \\right)", "(1,2)"), ("\\$4", "4"),
])
def test_math_normalisation_rule_by_rule(given, expected):
    assert math_normalize(given) == expected


def test_math_scores_the_last_box():
    assert math_score("first \\boxed{2}, finally \\boxed{\\dfrac{1}{2}}", "0.5") == 1.0
    assert math_score("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}") == 0.0
    assert math_score("\\fbox{7}", "7") == 0.0  # verl finds an \fbox but cannot unbox it
    assert math_score("no box", "7") == 0.0 and math_score("\\boxed{7", "7") == 0.0  # never closes
    assert math_score("so \\boxed 7$ done", "7") == 1.0  # MATH's "\boxed 7" form, up to a $
    assert math_equivalent("3\\text{ cm}\\text{ cm}", "3\\text{ cm}\\text{ cm}")  # normalising fails: equal as text


def test_dapo_reads_the_answer_line_else_the_box():
    assert dapo_score("reasoning...\nAnswer: 1,000 dollars", "1000") == {"score": 1.0, "acc": True, "pred": "1000"}
    assert dapo_score("Answer: \\frac12", "\\frac{1}{2}")["acc"]
    assert dapo_score("no line, but \\boxed{42}", "42") == {"score": 1.0, "acc": True, "pred": "42"}
    assert dapo_score("\\boxed{42.0}", "42") == {"score": -1.0, "acc": False, "pred": "42.0"}  # the box: exact text
    assert dapo_score("nothing", "42") == {"score": -1.0, "acc": False, "pred": "[INVALID]"}
    assert minerva_normalize("x = \\text{5 ways}") == "5"


def test_default_compute_score_picks_by_data_source():
    assert default_compute_score("openai/gsm8k", "#### 3", "3") == 1.0
    assert default_compute_score("HuggingFaceH4/MATH-500", "\\boxed{3}", "3") == 1.0
    assert default_compute_score("aime_2024", "Answer: 3", "3")["score"] == 1.0
    with pytest.raises(ValueError, match=r"no scorer for data_source='numina_olympiads' here"):
        default_compute_score("numina_olympiads", "", "")
    assert make_reward_fn("minirl.tasks.verl_scores:default_compute_score") is not None  # verl's signature, per sample
