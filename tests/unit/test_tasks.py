"""Synthetic tasks (reverse, add, sort): generation, splits, teachers, verifier; the registry."""

from __future__ import annotations

import pytest

from minirl.tasks import (
    TASKS,
    AddTask,
    ReverseTask,
    SortTask,
    Task,
    TeacherTask,
    build_task,
)
from minirl.tasks.synthetic import extract_answer
from minirl.types import Prompt

FAMILIES = ["reverse", "add", "sort"]


def test_registry_builds_every_kind_and_rejects_unknown() -> None:
    assert set(TASKS) == {"reverse", "add", "sort", "jsonl"}
    for kind in FAMILIES:
        task = build_task(kind, num_train=20, num_eval=5, seed=1)
        assert isinstance(task, Task) and isinstance(task, TeacherTask)
        assert task.name == kind
    with pytest.raises(ValueError, match="unknown task kind 'nope'; known kinds: reverse, add, sort, jsonl"):
        build_task("nope")


def test_prompt_and_answer_formats() -> None:
    reverse = ReverseTask(num_train=5, num_eval=1)
    prompt = reverse.train_prompts()[0]
    word = prompt.text[len("rev ") : -1]
    assert prompt.text == f"rev {word}\n" and len(word) == 8 and word.isalpha() and word.islower()
    assert prompt.answer == word[::-1]
    assert prompt.meta == {"family": "reverse", "difficulty": 8, "split": "train", "input": word}
    assert prompt.uid == "reverse-train-0"

    add = AddTask(num_train=5, num_eval=1)
    left, right = add.train_prompts()[0].text[len("add ") : -1].split("+")
    assert len(left) == len(right) == 3 and left[0] != "0" and right[0] != "0"
    assert add.train_prompts()[0].answer == str(int(left) + int(right))

    sort = SortTask(num_train=5, num_eval=1)
    digits = sort.train_prompts()[0].text[len("sort ") : -1]
    assert len(digits) == 8 and digits.isdigit()
    assert sort.train_prompts()[0].answer == "".join(sorted(digits))


@pytest.mark.parametrize("kind", FAMILIES)
def test_generation_is_deterministic_in_the_seed(kind: str) -> None:
    first = build_task(kind, num_train=50, num_eval=10, seed=3)
    again = build_task(kind, num_train=50, num_eval=10, seed=3)
    other = build_task(kind, num_train=50, num_eval=10, seed=4)
    assert first.train_prompts() == again.train_prompts()
    assert first.eval_prompts() == again.eval_prompts()
    assert [p.text for p in first.train_prompts()] != [p.text for p in other.train_prompts()]
    # The eval split does not depend on num_train: runs with different budgets share it.
    bigger = build_task(kind, num_train=80, num_eval=10, seed=3)
    assert bigger.eval_prompts() == first.eval_prompts()


@pytest.mark.parametrize("kind, difficulty", [("reverse", 8), ("reverse", 2), ("add", 3), ("add", 1), ("sort", 3)])
def test_train_and_eval_are_disjoint_and_distinct(kind: str, difficulty: int) -> None:
    task = build_task(kind, difficulty=difficulty, num_train=60, num_eval=20, seed=0)
    train = [prompt.text for prompt in task.train_prompts()]
    evaluation = [prompt.text for prompt in task.eval_prompts()]
    assert len(train) == 60 and len(evaluation) == 20
    assert len(set(train)) == 60 and len(set(evaluation)) == 20
    assert not set(train) & set(evaluation)
    assert all(prompt.meta["split"] == "eval" for prompt in task.eval_prompts())


def test_too_few_distinct_inputs_is_an_error() -> None:
    with pytest.raises(ValueError, match="reverse at difficulty 1 has only 26 distinct inputs"):
        ReverseTask(difficulty=1, num_train=20, num_eval=10)
    AddTask(difficulty=1, num_train=90, num_eval=10)  # exactly the 100 pairs of 0..9
    with pytest.raises(ValueError, match="difficulty must be >= 1"):
        SortTask(difficulty=0)


@pytest.mark.parametrize("kind", FAMILIES)
def test_difficulty_sets_the_input_and_solution_length(kind: str) -> None:
    easy = build_task(kind, difficulty=2, num_train=20, num_eval=0)
    hard = build_task(kind, difficulty=10, num_train=20, num_eval=0)
    assert len(hard.train_prompts()[0].text) > len(easy.train_prompts()[0].text)
    for style in easy.styles:
        easy_length = max(len(easy.teacher_solution(p, style)) for p in easy.train_prompts())
        hard_length = max(len(hard.teacher_solution(p, style)) for p in hard.train_prompts())
        assert hard_length > easy_length, style


@pytest.mark.parametrize("kind", FAMILIES)
def test_every_teacher_style_is_rewarded_over_many_seeds(kind: str) -> None:
    for seed in range(5):
        for difficulty in (1 if kind == "add" else 2, 3, 8, 13):
            task = build_task(kind, difficulty=difficulty, num_train=60, num_eval=20, seed=seed)
            for prompt in task.train_prompts() + task.eval_prompts():
                solutions = [task.teacher_solution(prompt, style) for style in task.styles]
                assert len(set(solutions)) == len(solutions)  # distinct formats
                for style, solution in zip(task.styles, solutions):
                    assert task.reward(prompt, solution) == 1.0, (style, prompt.text, solution)
                    assert solution.endswith(f"#### {prompt.answer}")
                    assert not solution.endswith("\n")


@pytest.mark.parametrize("kind", FAMILIES)
def test_teacher_solutions_are_short_at_the_default_difficulty(kind: str) -> None:
    task = build_task(kind, num_train=200, num_eval=0, seed=0)
    assert task.styles == ("direct", "stepwise", "verbose", "trace")
    limits = {"direct": 20, "stepwise": 120, "verbose": 120, "trace": 200}
    for style, limit in limits.items():
        longest = max(len(task.teacher_solution(prompt, style)) for prompt in task.train_prompts())
        assert longest <= limit, (style, longest)


def test_teacher_examples_by_hand() -> None:
    reverse = ReverseTask(num_train=1, num_eval=0)
    prompt = Prompt(text="rev cbdae\n", answer="eadbc")
    assert reverse.teacher_solution(prompt, "direct") == "#### eadbc"
    assert reverse.teacher_solution(prompt, "stepwise") == "5e 4a 3d 2b 1c\n#### eadbc"
    assert reverse.teacher_solution(prompt, "verbose") == "in cbdae\nsplit cbd|ae\nflip ea|dbc\n#### eadbc"
    assert reverse.teacher_solution(prompt, "trace") == "cbda | e\ncbd | ea\ncb | ead\nc | eadb\n | eadbc\n#### eadbc"

    add = AddTask(num_train=1, num_eval=0)
    prompt = Prompt(text="add 482+397\n", answer="879")
    assert add.teacher_solution(prompt, "stepwise") == "2+7+0=9\n8+9+0=17\n4+3+1=8\n#### 879"
    assert add.teacher_solution(prompt, "verbose") == "in 482+397\n82+97+0=179\n04+03+1=8\n#### 879"
    assert add.teacher_solution(prompt, "trace") == "2+7+0=9 9\n8+9+0=17 79\n4+3+1=8 879\n#### 879"
    prompt = Prompt(text="add 999+999\n", answer="1998")
    assert add.teacher_solution(prompt, "stepwise") == "9+9+0=18\n9+9+1=19\n9+9+1=19\n#### 1998"
    assert add.teacher_solution(prompt, "trace") == "9+9+0=18 8\n9+9+1=19 98\n9+9+1=19 998\n#### 1998"

    sort = SortTask(num_train=1, num_eval=0)
    prompt = Prompt(text="sort 3141592\n", answer="1123459")
    assert sort.teacher_solution(prompt, "stepwise") == "1x2 2x1 3x1 4x1 5x1 9x1\n#### 1123459"
    assert sort.teacher_solution(prompt, "verbose") == "in 3141592\nlo 11234\nhi 59\n#### 1123459"
    assert sort.teacher_solution(prompt, "trace") == (
        "341592 | 1\n34592 | 11\n3459 | 112\n459 | 1123\n59 | 11234\n9 | 112345\n | 1123459\n#### 1123459")


def test_trace_is_the_long_worked_solution() -> None:
    """The stress study's length axis: at difficulty 12 a reverse trace runs to hundreds of tokens."""
    task = ReverseTask(difficulty=12, num_train=50, num_eval=0)
    lengths = {style: min(len(task.teacher_solution(p, style)) for p in task.train_prompts()) for style in task.styles}
    assert lengths["trace"] >= 200 and lengths["trace"] > 3 * lengths["stepwise"] > 9 * lengths["direct"]


def test_teacher_rejects_unknown_style_and_foreign_prompt() -> None:
    task = ReverseTask(num_train=1, num_eval=0)
    with pytest.raises(ValueError, match=r"unknown teacher style 'socratic'.*direct, stepwise, verbose, trace"):
        task.teacher_solution(task.train_prompts()[0], "socratic")
    with pytest.raises(ValueError, match="not a reverse prompt"):
        task.teacher_solution(Prompt(text="add 1+2\n", answer="3"), "direct")
    with pytest.raises(ValueError, match="not an add prompt"):
        AddTask(num_train=1, num_eval=0).teacher_solution(Prompt(text="add 1-2\n", answer="-1"), "direct")


def test_wrong_and_malformed_completions_get_zero() -> None:
    task = ReverseTask(num_train=1, num_eval=0)
    prompt = Prompt(text="rev cbdae\n", answer="eadbc")
    assert task.reward(prompt, "#### eadbc") == 1.0
    assert task.reward(prompt, "  ####   eadbc \n") == 1.0  # surrounding whitespace is stripped
    assert task.reward(prompt, "#### wrong\n#### eadbc") == 1.0  # the last marker counts
    assert task.reward(prompt, "#### eadbc\n#### wrong") == 0.0
    assert task.reward(prompt, "#### eadb") == 0.0
    assert task.reward(prompt, "#### eadbcx") == 0.0
    assert task.reward(prompt, "#### eadbc\nmore text") == 0.0  # nothing may follow the answer
    assert task.reward(prompt, "eadbc") == 0.0  # no marker, no answer
    assert task.reward(prompt, "### eadbc") == 0.0
    assert task.reward(prompt, "") == 0.0
    assert task.reward(prompt, "#### EADBC") == 0.0  # exact, case-sensitive


def test_synthetic_answer_extraction() -> None:
    assert extract_answer("steps\n#### 42") == "42"
    assert extract_answer("#### 1\n#### 2 ") == "2"
    assert extract_answer("####") == ""
    assert extract_answer("no marker") is None
    assert extract_answer("##### 5") == "5"  # the last "####" is the one before " 5"
