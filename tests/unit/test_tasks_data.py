"""Data where users keep it: JSON, Parquet, a datasets directory; column mapping; bad rows."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from minirl.tasks.jsonl import JsonlTask, TaskDataError

ROWS = [
    {"question": "2+2?", "solution": "4", "level": 1},
    {"question": [{"role": "user", "content": "3+3?"}], "solution": 6, "level": 2},
]


def _write(tmp_path: Path, kind: str, rows: list[dict]) -> Path:
    if kind == "json":
        path = tmp_path / "data.json"
        path.write_text(json.dumps(rows))  # one array of objects
    elif kind == "parquet":
        path = tmp_path / "data.parquet"
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    else:
        path = tmp_path / "saved"
        datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("kind", ["json", "parquet", "directory"])
def test_formats_and_column_mapping(tmp_path: Path, kind: str) -> None:
    rows = ROWS
    if kind != "json":  # an Arrow column has one type: here every prompt is a chat, every answer a string
        rows = [dict(ROWS[0], question=[{"role": "user", "content": "2+2?"}]), dict(ROWS[1], solution="6")]
    path = _write(tmp_path, kind, rows)
    task = JsonlTask(path, eval_fraction=0.0, prompt_column="question", answer_column="solution")
    prompts = task.train_prompts()
    assert [p.answer for p in prompts] == ["4", "6"]
    assert prompts[1].messages == [{"role": "user", "content": "3+3?"}] and prompts[1].text == "3+3?"
    # a number in the answer column stays a number in the row's columns (TRL hands reward functions the stored value;
    # the answer itself is its text)
    stored = {"solution": 6} if kind == "json" else {}
    assert prompts[1].meta == {"source": f"{path}:row 2", "level": 2, **stored}


def test_a_bad_row_in_parquet_names_its_row(tmp_path: Path) -> None:
    path = _write(tmp_path, "parquet", [{"prompt": "p", "answer": "a"}, {"prompt": "", "answer": "b"}])
    with pytest.raises(TaskDataError) as error:
        JsonlTask(path)
    assert str(error.value) == f'{path}:row 2: field "prompt" is empty'
    skipped = JsonlTask(path, on_bad_row="skip", eval_fraction=0.0)
    assert skipped.skipped_reasons == [f'{path}:row 2: field "prompt" is empty']


def test_unreadable_files_are_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet at all")
    with pytest.raises(TaskDataError) as error:
        JsonlTask(broken)
    assert str(error.value).startswith(f"{broken}: cannot read as PARQUET (") and "\n" not in str(error.value)
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    with pytest.raises(TaskDataError, match="cannot read as PARQUET"):
        JsonlTask(empty)
    assert not [r for r in caplog.records if r.name.startswith("datasets")]  # not the library's line before minirl's
    empty_dir = tmp_path / "plain_dir"
    empty_dir.mkdir()
    with pytest.raises(TaskDataError, match="a directory, but neither a save_to_disk directory nor a dataset repository"):
        JsonlTask(empty_dir)
    with pytest.raises(TaskDataError, match=r"^openai/gsm8k: no such file; minirl does not download: `hf download "
                                            r"openai/gsm8k --repo-type dataset --local-dir DIR`"):
        JsonlTask("openai/gsm8k")  # a Hub id, as TRL's dataset_name


def test_answer_is_optional_for_user_rewards(tmp_path: Path) -> None:
    path = tmp_path / "no_answer.jsonl"
    path.write_text('{"prompt": "p"}\n')
    with pytest.raises(TaskDataError, match='field "answer" is missing'):
        JsonlTask(path)
    assert JsonlTask(path, eval_fraction=0.0, answer_required=False).train_prompts()[0].answer == ""


VERL_ROWS = [  # the layout of verl's data preprocessing scripts (examples/data_preprocess/gsm8k.py)
    {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "2+2? Put the answer after ####."}],
     "ability": "math", "reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": {"split": "train", "index": 0}},
    {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "3+4?"}],
     "ability": "math", "reward_model": {"style": "rule", "ground_truth": "7"}, "extra_info": {"split": "train", "index": 1}},
]


@pytest.mark.parametrize("kind", ["parquet", "json"])
def test_a_verl_data_file_needs_no_column_mapping(tmp_path: Path, kind: str) -> None:
    path = _write(tmp_path, kind, VERL_ROWS)
    prompts = JsonlTask(path, eval_fraction=0.0).train_prompts()
    assert [p.answer for p in prompts] == ["4", "7"]  # from reward_model.ground_truth
    assert prompts[1].messages == [{"role": "user", "content": "3+4?"}]
    assert prompts[0].meta["data_source"] == "openai/gsm8k" and prompts[0].meta["extra_info"] == {"split": "train", "index": 0}
    assert prompts[0].meta["reward_model"] == {"style": "rule", "ground_truth": "4"}  # the column itself passes through
    # a dotted answer column names the same field explicitly; one that is missing names itself
    assert [p.answer for p in JsonlTask(path, eval_fraction=0.0, answer_column="reward_model.ground_truth").train_prompts()] == ["4", "7"]
    with pytest.raises(TaskDataError, match=r':row 1: field "reward_model.answer" is missing$|:1: field "reward_model.answer" is missing$'):
        JsonlTask(path, eval_fraction=0.0, answer_column="reward_model.answer")
    # without verl's layout the default still asks for "answer"
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"prompt": "p", "reward_model": {"style": "rule"}}) + "\n")
    with pytest.raises(TaskDataError, match='field "answer" is missing'):
        JsonlTask(plain)


def test_a_structured_ground_truth_reaches_verl_functions_as_stored(tmp_path: Path) -> None:
    """verl passes reward_model.ground_truth as stored (Search-R1 keeps {"target": [...]}); with a user reward
    function minirl does too, and the answer text is its JSON. The built-in verifiers still need text."""
    from minirl.tasks import build_task
    from minirl.tasks.reward_runner import RewardRunner

    rows = [{"data_source": "nq", "prompt": [{"role": "user", "content": "Capital of France?"}],
             "reward_model": {"style": "rule", "ground_truth": {"target": ["Paris", "paris"]}}}]
    path = _write(tmp_path, "json", rows)
    with pytest.raises(TaskDataError, match=r'field "reward_model.ground_truth" must be a string or a number, got an object'):
        JsonlTask(path, eval_fraction=0.0)
    task = build_task("jsonl", path=path, eval_fraction=0.0, answer_required=False,
                      reward_function="tests.unit.trl_style_rewards:search_r1_style")
    prompt = task.train_prompts()[0]
    assert prompt.answer == '{"target": ["Paris", "paris"]}'
    with RewardRunner(task, timeout_s=5.0) as runner:
        assert runner.score([prompt], [(0, "paris"), (0, "Lyon")])[0].tolist() == [1.0, 0.0]


# --- dataset directories: splits and configs (TRL's dataset_name / dataset_config / dataset_*_split) ---------------

def _rows(tag: str, n: int) -> list[dict]:
    return [{"prompt": f"{tag} {i}", "answer": str(i)} for i in range(n)]


def _repository(tmp_path: Path) -> Path:
    """A dataset repository as `hf download --repo-type dataset` leaves it: two configs declared in the README's
    metadata (as gsm8k's main / socratic), each with its train and test files."""
    root = tmp_path / "gsm8k"
    for config, sizes in (("main", (5, 3)), ("socratic", (4, 2))):
        (root / config).mkdir(parents=True)
        for split, n in zip(("train", "test"), sizes):
            datasets.Dataset.from_list(_rows(f"{config}-{split}", n)).to_parquet(str(root / config / f"{split}-00000-of-00001.parquet"))
    entries = "".join(f"- config_name: {c}\n  data_files:\n  - split: train\n    path: {c}/train-*.parquet\n"
                      f"  - split: test\n    path: {c}/test-*.parquet\n" for c in ("main", "socratic"))
    (root / "README.md").write_text(f"---\nconfigs:\n{entries}---\n# a dataset\n")
    return root


def test_a_downloaded_repository_reads_its_config_and_splits(tmp_path: Path) -> None:
    root = _repository(tmp_path)
    task = JsonlTask(root, dataset_config="socratic", eval_split="test")
    assert [p.text for p in task.train_prompts()] == [f"socratic-train {i}" for i in range(4)]
    assert [p.text for p in task.eval_prompts()] == [f"socratic-test {i}" for i in range(2)]
    held_out = JsonlTask(root, dataset_config="main", eval_fraction=0.2)  # no eval split: a fraction of train
    assert len(held_out.train_prompts()) == 4 and held_out.eval_prompts()[0].text.startswith("main-train")
    swapped = JsonlTask(root, dataset_config="main", train_split="test", eval_split="train")
    assert (len(swapped.train_prompts()), len(swapped.eval_prompts())) == (3, 5)
    with pytest.raises(TaskDataError, match=r"split 'validation' \(ValueError: Unknown split \"validation\""):
        JsonlTask(root, dataset_config="main", eval_split="validation")
    with pytest.raises(TaskDataError, match="with config 'mian', split 'train'"):
        JsonlTask(root, dataset_config="mian")
    plain = tmp_path / "plain"  # data files named by split, no metadata
    (plain / "data").mkdir(parents=True)
    for split, n in (("train", 3), ("test", 2)):
        datasets.Dataset.from_list(_rows(split, n)).to_parquet(str(plain / "data" / f"{split}-00000-of-00001.parquet"))
    task = JsonlTask(plain, eval_split="test")
    assert (len(task.train_prompts()), len(task.eval_prompts())) == (3, 2)
    assert task.eval_prompts()[0].text == "test 0"


def test_a_saved_dataset_dict_gives_the_split_asked_for(tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(_rows("t", 3)),
                          "validation": datasets.Dataset.from_list(_rows("v", 2))}).save_to_disk(str(saved))
    task = JsonlTask(saved, eval_split="validation")
    assert [p.text for p in task.eval_prompts()] == ["v 0", "v 1"] and len(task.train_prompts()) == 3
    with pytest.raises(TaskDataError, match=r"a DatasetDict without a 'test' split \(splits: train, validation\)"):
        JsonlTask(saved, eval_split="test")
    with pytest.raises(TaskDataError, match="a save_to_disk directory has no configs"):
        JsonlTask(saved, dataset_config="main")
    one = tmp_path / "one"
    datasets.Dataset.from_list(_rows("o", 3)).save_to_disk(str(one))
    with pytest.raises(TaskDataError, match=r"one saved Dataset, without splits \(asked for 'test'\)"):
        JsonlTask(one, eval_split="test")
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows("j", 3)))
    with pytest.raises(TaskDataError, match=r"d.jsonl: a file holds one split; a split \('test'\)"):
        JsonlTask(data, eval_split="test")


def test_the_config_keys_reach_the_task(tmp_path: Path) -> None:
    from minirl.config import load_config
    from minirl.runtime import build_task

    root = _repository(tmp_path)
    cfg = load_config(None, ["task.kind=jsonl", f"task.path={root}", "task.dataset_config=main", "task.eval_split=test"])
    task = build_task(cfg)
    assert (len(task.train_prompts()), len(task.eval_prompts())) == (5, 3)


def test_several_files_are_one_dataset_in_order(tmp_path: Path) -> None:
    """``task.path`` as a list (verl's ``data.train_files`` list): their rows one after another; a held-out list too."""
    from minirl.config import load_config
    from minirl.runtime import build_task

    first, second = tmp_path / "a.jsonl", tmp_path / "b.parquet"
    first.write_text("".join(json.dumps(r) + "\n" for r in _rows("a", 3)))
    datasets.Dataset.from_list(_rows("b", 2)).to_parquet(str(second))
    task = JsonlTask([first, second], eval_path=[second, first])
    assert [p.text for p in task.train_prompts()] == ["a 0", "a 1", "a 2", "b 0", "b 1"]
    assert [p.text for p in task.eval_prompts()] == ["b 0", "b 1", "a 0", "a 1", "a 2"]
    cfg = load_config(None, ["task.kind=jsonl", f"task.path=[{first}, {second}]", "task.eval_fraction=0.4"])
    assert cfg.task.path == [str(first), str(second)]
    task = build_task(cfg)
    assert (len(task.train_prompts()), len(task.eval_prompts())) == (3, 2)  # 40 % of the five rows held out
    with pytest.raises(TaskDataError, match=r"task.path: an empty list"):
        JsonlTask([])


def test_system_prompt_and_chat_prompts(tmp_path: Path) -> None:
    """open-r1's make_conversation: a text prompt becomes [system, user]; a chat keeps its own system message."""
    path = tmp_path / "d.jsonl"
    rows = [{"prompt": "2+2?", "answer": "4"},
            {"prompt": [{"role": "system", "content": "own"}, {"role": "user", "content": "3+3?"}], "answer": "6"},
            {"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    system = "Think first."
    first, second, third = JsonlTask(path, eval_fraction=0.0, system_prompt=system).train_prompts()
    assert first.messages == [{"role": "system", "content": system}, {"role": "user", "content": "2+2?"}]
    assert second.messages == rows[1]["prompt"]  # not a second system message
    assert third.messages == [{"role": "system", "content": system}, {"role": "user", "content": "1+1?"}]
    assert first.text == "Think first.\n2+2?"
    plain, *_ = JsonlTask(path, eval_fraction=0.0).train_prompts()
    assert plain.messages is None and plain.text == "2+2?"  # TRL's rule: a text prompt is plain text
    chat, *_ = JsonlTask(path, eval_fraction=0.0, chat_prompts=True).train_prompts()
    assert chat.messages == [{"role": "user", "content": "2+2?"}]


@pytest.mark.parametrize("column", ["images", "image", "videos"])
def test_a_row_with_images_is_one_line_not_trained_text_only(tmp_path: Path, column: str) -> None:
    """verl's multimodal rows (an images column beside a prompt with <image>) and TRL's vision datasets: minirl trains
    text models, so a row holding media is one line (skipped and counted with task.on_bad_row: skip); an empty or null
    media column is nothing."""
    rows = [{"prompt": "p", "answer": "a"}, {"prompt": "<image>q", "answer": "b", column: [{"bytes": "..."}]},
            {"prompt": "r", "answer": "c", column: []}, {"prompt": "s", "answer": "d", column: None}]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(TaskDataError) as error:
        JsonlTask(path)
    assert str(error.value) == (f'{path}:2: field "{column}" holds images or videos; minirl trains text models (drop '
                                "the column to train on the text alone)")
    assert JsonlTask(path, on_bad_row="skip", eval_fraction=0.0).skipped_rows == 1
