"""One tokenisation of a prompt for the engine, the trainer and SFT; chat templates, BOS, stop tokens."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from minirl.batching import collate
from minirl.models.io import load_model_and_tokenizer
from minirl.rollout.native import NativeEngine
from minirl.sft_data import read_sft_examples, row_to_example, sft_batch
from minirl.tasks.chat import (
    ChatTemplateError,
    cut_at_stop_strings,
    encode_prompt,
    stop_token_ids,
)
from minirl.tasks.jsonl import JsonlTask
from minirl.types import Completion, Prompt, SamplingParams

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "chat_math"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 3 + 4?"}]


def _builder():
    spec = importlib.util.spec_from_file_location("chat_math_build_model", EXAMPLE / "build_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, object]:
    builder = _builder()
    directory = tmp_path_factory.mktemp("chat_model")
    tokenizer = builder.build_tokenizer(builder.corpus(EXAMPLE / "data"))
    builder.build_model(tokenizer).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return load_model_and_tokenizer(str(directory))  # as a run loads it: AutoTokenizer, AutoModelForCausalLM


def test_engine_trainer_and_sft_tokenize_a_chat_row_identically(chat_model, tmp_path: Path) -> None:
    model, tokenizer = chat_model
    data = tmp_path / "rl.jsonl"
    data.write_text(json.dumps({"prompt": MESSAGES, "answer": "7", "kind": "number"}) + "\n")
    prompt = JsonlTask(data, eval_fraction=0.0).train_prompts()[0]
    assert prompt.messages == MESSAGES and prompt.meta["kind"] == "number"
    expected = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    expected = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "keys") else expected
    ids = encode_prompt(tokenizer, prompt)
    assert ids == list(expected) and ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id
    # the engine
    engine = NativeEngine(model, eos_token_id=stop_token_ids(tokenizer, model), pad_token_id=tokenizer.pad_token_id,
                          tokenizer=tokenizer)
    completions = engine.generate([prompt], 2, SamplingParams(max_new_tokens=4, seed=1))
    assert all(c.prompt_ids == ids for c in completions)
    # the trainer scores the collated batch: its rows start with exactly those ids
    batch = collate(completions, torch.zeros(2), pad_token_id=tokenizer.pad_token_id)
    assert batch.input_ids[0, : len(ids)].tolist() == ids
    # SFT, both TRL shapes: the prompt part is the same ids, the loss starts right after it
    answer = [{"role": "assistant", "content": "\\boxed{7}"}]
    for row in ({"prompt": MESSAGES, "completion": answer}, {"messages": MESSAGES + answer}):
        example = row_to_example(row, "row", tokenizer)
        assert example.input_ids[: len(ids)] == ids
        assert example.loss_mask == [False] * len(ids) + [True] * (len(example.input_ids) - len(ids))
        assert tokenizer.decode(example.input_ids[len(ids):]) == "\\boxed{7}<|im_end|>\n"


def test_bos_as_the_tokenizer_says_and_never_twice(chat_model) -> None:
    _, tokenizer = chat_model
    bos = tokenizer.bos_token_id
    plain = encode_prompt(tokenizer, Prompt(text="What is 3 + 4?", answer=""))
    assert plain[0] == bos and plain.count(bos) == 1  # this tokenizer prepends BOS to plain text
    already = encode_prompt(tokenizer, Prompt(text="<s>What is 3 + 4?", answer=""))
    assert already == plain  # a text that starts with BOS gets no second one
    from minirl.models.tokenizer import build_char_tokenizer

    char = build_char_tokenizer()  # minirl's own: no special tokens at all, as before
    assert encode_prompt(char, Prompt(text="ab", answer="")) == char.encode("ab", add_special_tokens=False)


def test_stop_tokens_are_the_union_of_tokenizer_and_generation_config(chat_model) -> None:
    model, tokenizer = chat_model
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert stop_token_ids(tokenizer, model) == [tokenizer.eos_token_id, im_end]
    model.generation_config.eos_token_id = im_end  # an int works too
    try:
        assert stop_token_ids(tokenizer, model) == [tokenizer.eos_token_id, im_end]
    finally:
        model.generation_config.eos_token_id = [im_end, tokenizer.eos_token_id]


def test_stop_strings_cut_the_completion_and_keep_exact_logprobs(chat_model) -> None:
    _, tokenizer = chat_model
    ids = tokenizer.encode("7. Done. More text", add_special_tokens=False)
    logp = torch.arange(len(ids), dtype=torch.float32)
    completion = Completion(0, 0, [1, 2], ids, logp, "length", text=tokenizer.decode(ids))
    cut = cut_at_stop_strings(completion, tokenizer, ["Done."])
    assert cut.text.endswith("Done.") and "More" not in cut.text and cut.finish_reason == "eos"
    assert cut.logp_rollout.tolist() == list(range(len(cut.completion_ids)))
    assert cut_at_stop_strings(Completion(0, 0, [1], [5], torch.zeros(1), "eos", text="x"), tokenizer, ["Done."]).text == "x"


def test_plain_mode_template_file_and_missing_template(chat_model, tmp_path: Path) -> None:
    data = tmp_path / "rl.jsonl"
    data.write_text(json.dumps({"prompt": MESSAGES, "answer": "7"}) + "\n")
    plain = JsonlTask(data, eval_fraction=0.0, plain_chat=True).train_prompts()[0]
    assert plain.messages is None and plain.text == "Be brief.\nWhat is 3 + 4?"
    from minirl.models.tokenizer import build_char_tokenizer

    with pytest.raises(ChatTemplateError, match=r"task\.chat_template to a Jinja template file"):
        encode_prompt(build_char_tokenizer(), JsonlTask(data, eval_fraction=0.0).train_prompts()[0])
    from minirl.tasks.chat import apply_chat_setting

    char = build_char_tokenizer()
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}A:")
    apply_chat_setting(char, str(template))
    assert char.decode(encode_prompt(char, Prompt(text="", answer="", messages=MESSAGES))) == (
        "system: Be brief.\nuser: What is 3 + 4?\nA:"
    )


def test_sft_rows_loss_options_packing_and_bad_rows(chat_model, tmp_path: Path) -> None:
    _, tokenizer = chat_model
    data = tmp_path / "sft.jsonl"
    rows = [{"prompt": "1+1=", "completion": "2"}, {"messages": MESSAGES + [{"role": "assistant", "content": "7"}]}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    completion_only = read_sft_examples(data, tokenizer)
    first = completion_only[0]
    assert tokenizer.decode(first.input_ids) == "<s>1+1=2<|endoftext|>"
    assert [t for t, m in zip(first.input_ids, first.loss_mask) if m] == tokenizer.encode("2", add_special_tokens=False) + [tokenizer.eos_token_id]
    whole = read_sft_examples(data, tokenizer, loss_on="all")
    assert whole[0].loss_mask == [False] + [True] * (len(first.input_ids) - 1)
    batch = sft_batch(completion_only, tokenizer.pad_token_id)
    assert batch.mask.sum() == sum(sum(e.loss_mask) for e in completion_only)  # targets t+1 that carry the loss
    from minirl.sft_data import pack

    packed = pack(completion_only, max_length=1000)
    assert len(packed) == 1 and packed[0].input_ids == completion_only[0].input_ids + completion_only[1].input_ids
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "q", "completion": "a"}\n{"prompt": "q", "answer": "a"}\n')
    from minirl.tasks.jsonl import TaskDataError

    with pytest.raises(TaskDataError) as error:
        read_sft_examples(bad, tokenizer)
    assert str(error.value) == f'{bad}:2: expected an object with "prompt" and "completion", with "messages" or with "text"'


def test_sft_language_modeling_rows(chat_model, tmp_path: Path) -> None:
    """TRL's third SFT shape, ``{"text": ...}``: the tokenizer's special tokens, EOS appended once, all but the
    first token trained (``loss_on`` has no prompt to leave out)."""
    _, tokenizer = chat_model
    data = tmp_path / "lm.jsonl"
    eos = tokenizer.eos_token
    data.write_text(json.dumps({"text": "1+1=2"}) + "\n" + json.dumps({"text": f"3+4=7{eos}"}) + "\n")
    first, second = read_sft_examples(data, tokenizer)
    assert tokenizer.decode(first.input_ids) == "<s>1+1=2<|endoftext|>" == tokenizer.decode(second.input_ids).replace("3+4=7", "1+1=2")
    assert first.input_ids == tokenizer("1+1=2")["input_ids"] + [tokenizer.eos_token_id]
    assert first.loss_mask == [False] + [True] * (len(first.input_ids) - 1)
    assert read_sft_examples(data, tokenizer, loss_on="all")[0].loss_mask == first.loss_mask
    from minirl.tasks.jsonl import TaskDataError

    both = tmp_path / "text_and_prompt.jsonl"  # a stray "prompt" column beside "text": still the text row
    both.write_text(json.dumps({"text": "1+1=2", "prompt": "ignored"}) + "\n")
    assert read_sft_examples(both, tokenizer)[0].input_ids == first.input_ids
    bad = tmp_path / "bad_text.jsonl"
    bad.write_text(json.dumps({"text": ""}) + "\n")
    with pytest.raises(TaskDataError, match=r':1: field "text" must be a non-empty string$'):
        read_sft_examples(bad, tokenizer)


def test_cli_one_line_errors_for_chat_rows_and_sft_without_data(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from minirl.cli import main

    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"prompt": MESSAGES, "answer": "7"}) + "\n" + json.dumps({"prompt": "x", "answer": "1"}) + "\n")
    # minirl's character tokenizer has no chat template: one line naming the key and both ways out
    assert main(["eval", "qwen3-moe-tiny", "task.kind=jsonl", f"task.path={data}", "eval.num_prompts=1"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "minirl: error: task.chat_template: a conversational prompt needs a chat template: the tokenizer has none; "
        "set task.chat_template to a Jinja template file, or task.chat_template=plain to feed the messages as plain text"
    ]
    assert main(["sft", str(_sft_config(tmp_path, data)), "--output", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == (
        "minirl: error: cold_start.style: 'stepwise' is not a style of task 'chat' (allowed: none (this task has no "
        "teacher)); for your own data set cold_start.data to a file of prompt/completion or messages rows"
    )


def _sft_config(tmp_path: Path, data: Path) -> Path:
    config = tmp_path / "sft.yaml"
    config.write_text(f"model: {{preset: qwen3-moe-tiny}}\ntask: {{kind: jsonl, path: {data}, chat_template: plain}}\n")
    return config


NO_THINK = "{% if enable_thinking is defined and not enable_thinking %} <think></think>{% endif %}"
THINKING = ("{% for m in messages %}{{ m['role'] }}:{% if m['role'] == 'assistant' %}" + NO_THINK + "{% endif %} "
            "{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:" + NO_THINK + "{% endif %}")
# Qwen3's enable_thinking switch, in miniature


def test_chat_template_kwargs_reach_every_rendering_and_are_not_saved(tmp_path: Path) -> None:
    """``task.chat_template_kwargs`` (TRL's ``chat_template_kwargs``, verl's ``apply_chat_template_kwargs``): the
    prompt the engine and trainer see, SFT's prompt part and its loss mask, all through the run's tokenizer."""
    from minirl.config import load_config
    from minirl.runtime import build_model

    template = tmp_path / "t.jinja"
    template.write_text(THINKING)
    prompt = Prompt(text="", answer="", messages=MESSAGES)
    on, tokenizer = [build_model(load_config(None, ["model.preset=qwen3-dense-2m", f"task.chat_template={template}",
                                                    *extra]))[1] for extra in ([], ["task.chat_template_kwargs={enable_thinking: false}"])]
    assert on.decode(encode_prompt(on, prompt)).endswith("?\nassistant:")
    assert tokenizer.decode(encode_prompt(tokenizer, prompt)).endswith("?\nassistant: <think></think>")
    example = row_to_example({"prompt": MESSAGES, "completion": [{"role": "assistant", "content": "7"}]}, "row", tokenizer)
    prompt_ids = encode_prompt(tokenizer, prompt)
    assert example.input_ids[: len(prompt_ids)] == prompt_ids and not any(example.loss_mask[: len(prompt_ids)])
    tokenizer.save_pretrained(tmp_path / "saved")
    assert "enable_thinking" not in (tmp_path / "saved" / "tokenizer_config.json").read_text()
