"""JSONL tasks: loading, splits, every bad-input message, answer extraction, verifiers."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from minirl.tasks import JsonlTask, Task, TaskDataError, build_task
from minirl.tasks.jsonl import (
    exact_reward,
    extract_answer,
    last_boxed,
    math_equivalent,
    math_verify_reward,
    read_jsonl_prompts,
)


def write_rows(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def numbered_rows(count: int) -> list[dict]:
    return [{"prompt": f"what is {index}+1?", "answer": str(index + 1)} for index in range(count)]


# --- happy path ---------------------------------------------------------------------------------


def test_jsonl_happy_path_with_numbers_and_extra_fields(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text(
        '{"prompt": "2+2?", "answer": "4", "id": "a"}\n'
        "\n"  # blank lines hold no row and are ignored
        '{"prompt": "half?", "answer": 0.5}\n'
        '{"prompt": "ten?", "answer": 10}\n',
        encoding="utf-8",
    )
    task = build_task("jsonl", path=str(path), eval_fraction=0.0)
    assert isinstance(task, Task) and task.name == "train"
    prompts = task.train_prompts()
    assert [p.text for p in prompts] == ["2+2?", "half?", "ten?"]
    assert [p.answer for p in prompts] == ["4", "0.5", "10"]
    assert prompts[0].meta == {"source": f"{path}:1", "id": "a"}
    assert prompts[2].uid == f"{path}:4"
    assert task.eval_prompts() == []


def test_jsonl_eval_split_is_seeded_and_disjoint(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "data.jsonl", numbered_rows(50))
    task = JsonlTask(path, eval_fraction=0.2, seed=1)
    train, evaluation = task.train_prompts(), task.eval_prompts()
    assert len(train) == 40 and len(evaluation) == 10
    assert not {p.uid for p in train} & {p.uid for p in evaluation}
    assert JsonlTask(path, eval_fraction=0.2, seed=1).eval_prompts() == evaluation
    assert JsonlTask(path, eval_fraction=0.2, seed=2).eval_prompts() != evaluation
    # A tiny file still gets one eval row; a single row cannot be split.
    small = write_rows(tmp_path / "small.jsonl", numbered_rows(3))
    assert len(JsonlTask(small, eval_fraction=0.1).eval_prompts()) == 1
    single = write_rows(tmp_path / "single.jsonl", numbered_rows(1))
    with pytest.raises(TaskDataError, match="1 row: none left for evaluation"):  # it evaluated on nothing: max() of []
        JsonlTask(single, eval_fraction=0.1)
    with pytest.raises(ValueError, match="eval_fraction"):
        JsonlTask(path, eval_fraction=1.0)


def test_jsonl_separate_eval_file(tmp_path: Path) -> None:
    train = write_rows(tmp_path / "train.jsonl", numbered_rows(5))
    evaluation = write_rows(tmp_path / "eval.jsonl", numbered_rows(2))
    task = JsonlTask(train, eval_path=evaluation)
    assert len(task.train_prompts()) == 5 and len(task.eval_prompts()) == 2
    with pytest.raises(TaskDataError, match=r"missing\.jsonl: no such file"):
        JsonlTask(train, eval_path=tmp_path / "missing.jsonl")


def test_jsonl_accepts_a_utf8_bom_and_unicode(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + '{"prompt": "caf\u00e9?", "answer": "\u00e9"}\n'.encode("utf-8"))
    assert JsonlTask(path, eval_fraction=0.0).train_prompts()[0].answer == "\u00e9"


# --- every bad input: one line, naming file and line -------------------------------------------

BAD_LINES = [
    ("{not json}", "not valid JSON (Expecting property name enclosed in double quotes at column 2)"),
    ('["prompt", "answer"]', 'expected a JSON object with "prompt" and "answer", got an array'),
    ('"just a string"', 'expected a JSON object with "prompt" and "answer", got a string'),
    ('{"answer": "1"}', 'field "prompt" is missing'),
    ('{"prompt": "q"}', 'field "answer" is missing'),
    ('{"prompt": 5, "answer": "1"}', 'field "prompt" must be a string or a list of chat messages, got a number'),
    ('{"prompt": null, "answer": "1"}', 'field "prompt" must be a string or a list of chat messages, got null'),
    ('{"prompt": [], "answer": "1"}', 'field "prompt" is an empty list of messages'),
    ('{"prompt": ["hi"], "answer": "1"}', 'field "prompt" message 0 must be an object with string "role" and "content", got a string'),
    ('{"prompt": [{"role": "user"}], "answer": "1"}',
     'field "prompt" message 0 must be an object with string "role" and "content", got an object'),
    ('{"prompt": "q", "answer": ["1"]}', 'field "answer" must be a string or a number, got an array'),
    ('{"prompt": "q", "answer": true}', 'field "answer" must be a string or a number, got a boolean'),
    ('{"prompt": "q", "answer": null}', 'field "answer" must be a string or a number, got null'),
    ('{"prompt": "q", "answer": NaN}', 'field "answer" must be finite, got nan'),
    ('{"prompt": "  ", "answer": "1"}', 'field "prompt" is empty'),
    ('{"prompt": "q", "answer": ""}', 'field "answer" is empty'),
    ('{"prompt": [{"role": "user", "content": [{"type": "image", "image": "x.png"}]}], "answer": "1"}',
     'field "prompt" message 0 content part 0 is of type \'image\': minirl trains text models (content as a string, '
     'or parts of type "text" with a string "text")'),
]


def test_chat_content_given_as_text_parts_is_their_text(tmp_path: Path) -> None:
    """The OpenAI / TRL multimodal form with text parts only: the message's content is the parts' text, joined."""
    path = tmp_path / "parts.jsonl"
    parts = [{"type": "text", "text": "What is "}, {"type": "text", "text": "3+4?"}]
    path.write_text(json.dumps({"prompt": [{"role": "user", "content": parts}], "answer": "7"}) + "\n", encoding="utf-8")
    (prompt,) = read_jsonl_prompts(path)
    assert prompt.messages == [{"role": "user", "content": "What is 3+4?"}] and prompt.text == "What is 3+4?"


@pytest.mark.parametrize("bad_line, message", BAD_LINES)
def test_jsonl_bad_row_names_file_and_line(tmp_path: Path, bad_line: str, message: str) -> None:
    path = tmp_path / "train.jsonl"
    good = json.dumps({"prompt": "p", "answer": "a"})
    path.write_text(f"{good}\n{good}\n\n{bad_line}\n{good}\n", encoding="utf-8")
    with pytest.raises(TaskDataError) as error:
        JsonlTask(path)
    assert str(error.value) == f"{path}:4: {message}"


def test_jsonl_not_utf8_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "p", "answer": "a"}\n{"prompt": "caf\xe9", "answer": "a"}\n')
    with pytest.raises(TaskDataError) as error:
        JsonlTask(path)
    assert str(error.value) == f"{path}:2: not valid UTF-8 (byte 15 of the line)"


def test_jsonl_missing_empty_or_directory(tmp_path: Path) -> None:
    with pytest.raises(TaskDataError) as error:
        JsonlTask(tmp_path / "nowhere.jsonl")
    assert str(error.value) == f"{tmp_path / 'nowhere.jsonl'}: no such file"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"empty.jsonl: no rows"):
        JsonlTask(empty)
    with pytest.raises(TaskDataError, match="a directory, but neither a save_to_disk directory nor a dataset repository"):
        JsonlTask(tmp_path)
    with pytest.raises(ValueError, match="unknown JSONL reward 'fuzzy'"):
        JsonlTask(empty, reward="fuzzy")  # type: ignore[arg-type]


# --- answer extraction --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("so the answer is \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),  # last box, nested braces
        ("\\boxed{ 7 } #### 8", "7"),  # a box wins over a marker
        ("\\boxed{3} and \\boxed{unclosed", "3"),  # an unclosed last box falls back to the earlier
        ("work\n#### 12\n", "12"),
        ("#### 1\n#### 2", "2"),
        ("reasoning... Answer: 5", "5"),
        ("ans: 6", "6"),
        ("The final answer: x+1", "x+1"),
        ("line one\n  last line  \n\n", "last line"),
        ("", ""),
        ("\\boxed{}", ""),
    ],
)
def test_jsonl_answer_extraction(completion: str, expected: str) -> None:
    assert extract_answer(completion) == expected


def test_last_boxed_none_without_a_closed_box() -> None:
    assert last_boxed("no box") is None
    assert last_boxed("\\boxed{open") is None


# --- verifiers ----------------------------------------------------------------------------------


def test_exact_reward(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "t.jsonl", [{"prompt": "q", "answer": " 0.5 "}])
    task = JsonlTask(path, eval_fraction=0.0, reward="exact")
    prompt = task.train_prompts()[0]
    assert task.reward(prompt, "#### 0.5") == 1.0
    assert task.reward(prompt, "\\boxed{0.5}") == 1.0
    assert task.reward(prompt, "#### 1/2") == 0.0  # exact does not know maths


def test_the_built_in_verifiers_as_reward_functions() -> None:
    """``task.reward`` as entries of ``task.reward_functions`` (verl's DAPO: the score beside the overlong penalty):
    per-sample, a completion as text or as TRL's chat message."""
    from minirl.tasks.reward_functions import make_reward_fn

    chat = [{"role": "assistant", "content": "so \\boxed{\\frac{1}{2}}"}]
    assert exact_reward("q", "#### 0.5", " 0.5 ") == 1.0 and exact_reward("q", chat, "0.5") == 0.0
    assert math_verify_reward("q", chat, "0.5") == 1.0 and math_verify_reward([{"role": "user", "content": "q"}], "#### 0.6", "0.5") == 0.0
    assert not make_reward_fn("minirl.tasks.jsonl:exact_reward").batched


@pytest.mark.parametrize(
    "answer, completion, expected",
    [
        ("0.5", "#### 1/2", 1.0),
        ("0.5", "so \\boxed{\\frac{1}{2}}", 1.0),
        ("\\frac{1}{2}", "Answer: 0.5", 1.0),
        ("1/2", "#### 0.50", 1.0),
        ("x+1", "#### 1+x", 1.0),
        ("3", "#### 3.0", 1.0),
        ("0.5", "#### 0.6", 0.0),
        ("2", "#### two", 0.0),
        ("7", "", 0.0),
        ("yes", "#### yes", 1.0),  # a reference math_verify cannot parse: exact match
    ],
)
def test_math_verify_reward(tmp_path: Path, answer: str, completion: str, expected: float) -> None:
    path = write_rows(tmp_path / "m.jsonl", [{"prompt": "q", "answer": answer}])
    task = JsonlTask(path, eval_fraction=0.0, reward="math_verify")
    assert task.reward(task.train_prompts()[0], completion) == expected


def test_math_verify_works_off_the_main_thread() -> None:
    # math_verify's timeout uses signal.alarm, which raises outside the main thread.
    results: list[object] = []

    def check() -> None:
        try:
            results.append(math_equivalent("1/2", "0.5"))
            results.append(math_equivalent("0.6", "0.5"))
        except Exception as error:  # pragma: no cover - the failure being tested for
            results.append(error)

    thread = threading.Thread(target=check)
    thread.start()
    thread.join()
    assert results == [True, False]


def test_math_equivalent_directly() -> None:
    assert math_equivalent("\\frac{2}{4}", "0.5")
    assert not math_equivalent("", "0.5")
