"""SFT on chats is encoded whole (as TRL) for any chat template; vLLM stops where the native engine stops.

The tokenizer here is a byte-level BPE trained with ``tokenizers`` on whole conversations without a
regex pre-split, and the template separates turns with plain text ("User: ...\\nAssistant: ...\\n"),
so merges run across turn boundaries: encoding each turn on its own gives other ids.
"""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from minirl.rollout.vllm_engine import finish_completion, stop_params
from minirl.sft_data import pack, row_to_example
from minirl.tasks.chat import cut_at_stop_strings
from minirl.types import Completion, Prompt

PLAIN = ("{% for m in messages %}{% if m['role'] == 'user' %}User: {{ m['content'] }}\n"
         "{% else %}Assistant: {{ m['content'] }}\n{% endif %}{% endfor %}"
         "{% if add_generation_prompt %}Assistant: {% endif %}")
# the same text, with the assistant turns marked for transformers' return_assistant_tokens_mask
MARKED = PLAIN.replace("Assistant: {{ m['content'] }}\n", "Assistant: {% generation %}{{ m['content'] }}\n{% endgeneration %}")
CHAT = [{"role": "user", "content": "3+4?"}, {"role": "assistant", "content": "7"},
        {"role": "user", "content": "5+5?"}, {"role": "assistant", "content": "10"}]


@pytest.fixture(scope="module")
def plain_tokenizer() -> PreTrainedTokenizerFast:
    corpus = [f"User: {a}+{b}?\nAssistant: {a + b}\n" for a in range(10) for b in range(10)]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=275, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<eos>")
    tokenizer.chat_template = PLAIN
    return tokenizer


def _marked(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    marked = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, eos_token="<eos>", pad_token="<eos>")
    marked.chat_template = MARKED
    return marked


def _pieces(tokenizer, example) -> list[tuple[str, bool]]:
    return [(tokenizer.decode([i]), m) for i, m in zip(example.input_ids, example.loss_mask)]


def test_multi_turn_chat_is_encoded_whole_and_masks_exactly_the_assistant_turns(plain_tokenizer) -> None:
    tokenizer = plain_tokenizer
    text = "User: 3+4?\nAssistant: 7\nUser: 5+5?\nAssistant: 10\n"
    assert tokenizer.apply_chat_template(CHAT, tokenize=False) == text
    # a merge spans the second generation prompt and the answer's first digit: per-turn encoding differs
    per_turn = tokenizer.encode("User: 3+4?\nAssistant: 7\nUser: 5+5?\nAssistant: ") + tokenizer.encode("10\n")
    assert tokenizer.encode(text) != per_turn
    example = row_to_example({"messages": CHAT}, "row", tokenizer)
    assert example.input_ids == tokenizer.encode(text, add_special_tokens=False)
    # hand-checked: the assistant turns are "7\n" and "10\n"; a token overlapping one is trained
    # (transformers' assistant-mask rule), so "?\nAssistant: 1" is, "User: " after "7\n" is not
    assert _pieces(tokenizer, example) == [
        ("User: ", False), ("3", False), ("+", False), ("4", False), ("?\nAssistant: ", False), ("7", True),
        ("\n", True), ("User: ", False), ("5", False), ("+", False), ("5", False), ("?\nAssistant: 1", True),
        ("0", True), ("\n", True),
    ]
    # a template with {% generation %} blocks: transformers' own mask, the same ids and mask here
    marked = _marked(tokenizer)
    assert marked.apply_chat_template(CHAT, tokenize=False) == text
    from_blocks = row_to_example({"messages": CHAT}, "row", marked)
    assert (from_blocks.input_ids, from_blocks.loss_mask) == (example.input_ids, example.loss_mask)
    # packing joins the whole examples, masks and all
    packed = pack([example, from_blocks], max_length=100)
    assert len(packed) == 1 and packed[0].input_ids == example.input_ids * 2
    assert packed[0].loss_mask == example.loss_mask * 2


def test_conversational_prompt_completion_trains_what_follows_the_prompt_in_the_whole_encoding(plain_tokenizer) -> None:
    tokenizer = plain_tokenizer
    row = {"prompt": CHAT[:3], "completion": CHAT[3:]}
    example = row_to_example(row, "row", tokenizer)
    assert example.input_ids == row_to_example({"messages": CHAT}, "row", tokenizer).input_ids
    # the earlier assistant turn belongs to the prompt: only the completion "10\n" is trained
    assert [piece for piece, trained in _pieces(tokenizer, example) if trained] == ["?\nAssistant: 1", "0", "\n"]
    from_blocks = row_to_example(row, "row", _marked(tokenizer))  # the {% generation %} path, cut the same way
    assert (from_blocks.input_ids, from_blocks.loss_mask) == (example.input_ids, example.loss_mask)


def test_verl_sft_rows_nested_columns_and_chat_prompts(plain_tokenizer, tmp_path) -> None:
    """verl's SFT parquet (``extra_info.question`` / ``extra_info.answer``, ``prompt_dict_keys``) with its
    layout: the prompt through the chat template with the generation prompt, the answer as text + EOS."""
    import datasets

    from minirl.sft_data import read_sft_examples
    from minirl.tasks.jsonl import TaskDataError

    rows = [{"data_source": "gsm8k", "extra_info": {"question": "3+4?", "answer": "7"}}]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "sft.parquet"))
    columns = ("extra_info.question", "extra_info.answer")
    (verl,) = read_sft_examples(tmp_path / "sft.parquet", plain_tokenizer, columns=columns, chat_prompts=True)
    prompt_ids = plain_tokenizer.encode("User: 3+4?\nAssistant: ", add_special_tokens=False)
    answer_ids = plain_tokenizer.encode("7", add_special_tokens=False) + [plain_tokenizer.eos_token_id]
    assert verl.input_ids == prompt_ids + answer_ids
    assert verl.loss_mask == [False] * len(prompt_ids) + [True] * len(answer_ids)
    (trl,) = read_sft_examples(tmp_path / "sft.parquet", plain_tokenizer, columns=columns)  # TRL: a string is plain
    assert trl.input_ids == plain_tokenizer.encode("3+4?") + answer_ids
    with pytest.raises(TaskDataError, match=r'sft.parquet:row 1: no field "extra_info.solution" \(cold_start.completion_column\)'):
        read_sft_examples(tmp_path / "sft.parquet", plain_tokenizer, columns=("extra_info.question", "extra_info.solution"))


def test_a_template_that_rewrites_earlier_turns_is_one_line_naming_the_row(plain_tokenizer) -> None:
    from minirl.tasks.jsonl import TaskDataError

    rewriting = _marked(plain_tokenizer)  # shows only the last assistant turn's content, no generation blocks
    rewriting.chat_template = PLAIN.replace("{{ m['content'] }}\n{% endif %}", "{{ m['content'] if loop.last else '' }}\n{% endif %}")
    with pytest.raises(TaskDataError, match=r"^data.jsonl:3: the chat template does not render a conversation as a prefix") as error:
        row_to_example({"messages": CHAT}, "data.jsonl:3", rewriting)
    assert "\n" not in str(error.value)


# ----------------------------------------------------------------------------- tools and per-row template variables

# PLAIN with TRL's per-row extras: the tool schemas' names, a template variable, assistant tool calls, tool results
TOOLS = ("{% if tools %}Tools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}\n{% endif %}"
         "{% if style %}Style: {{ style }}\n{% endif %}"
         "{% for m in messages %}{% if m['role'] == 'user' %}User: {{ m['content'] }}\n"
         "{% elif m['role'] == 'tool' %}Tool: {{ m['content'] }}\n"
         "{% elif m.tool_calls %}Assistant: call {{ m.tool_calls[0]['function']['name'] }}\n"
         "{% else %}Assistant: {{ m['content'] }}\n{% endif %}{% endfor %}"
         "{% if add_generation_prompt %}Assistant: {% endif %}")
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}
CALLING = [{"role": "user", "content": "3+4?"},
           {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 3}}}]},
           {"role": "tool", "content": "7", "name": "add", "tool_call_id": None},
           {"role": "assistant", "content": "7"}]


def _tools_tokenizer(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    with_tools = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, eos_token="<eos>", pad_token="<eos>")
    with_tools.chat_template = TOOLS
    return with_tools


def test_a_function_calling_chat_trains_its_calls_with_its_tools_in_the_prompt(plain_tokenizer, tmp_path) -> None:
    """TRL's SFT row with ``tools`` (here a JSON string) and ``chat_template_kwargs``: every rendering gets them; the
    assistant's tool call (no content) and its answer are trained, the tool's result is context; a null field of a
    message (as a ``datasets`` table fills them) is dropped, the others reach the template."""
    import json

    tokenizer = _tools_tokenizer(plain_tokenizer)
    row = {"messages": CALLING, "tools": json.dumps([ADD]), "chat_template_kwargs": {"style": "short"}}
    example = row_to_example(row, "row", tokenizer)
    body = "User: 3+4?\nAssistant: call add\nTool: 7\nAssistant: 7\n"
    text = "Tools: add Style: short\n" + body  # (the template engine trims the newline after a block tag)
    assert example.input_ids == tokenizer.encode(text, add_special_tokens=False)
    trained = "".join(piece for piece, on in _pieces(tokenizer, example) if on)
    context = "".join(piece for piece, on in _pieces(tokenizer, example) if not on)
    assert "call add\n" in trained and trained.endswith("7\n") and "Tool: 7" in context and "Tools: add" in context
    from minirl.tasks.jsonl import check_messages

    kept = check_messages(CALLING, "row", "messages")
    assert kept[1] == CALLING[1] and kept[2] == {"role": "tool", "content": "7", "name": "add"}  # the null field dropped
    import datasets

    from minirl.sft_data import read_sft_examples

    # the same row beside a plain chat in a parquet that `datasets` writes: every message gets every field, nulls
    # where a message had none, and a row without tools a null "tools"
    datasets.Dataset.from_list([row, {"messages": CHAT, "tools": None, "chat_template_kwargs": None}]).to_parquet(
        str(tmp_path / "calls.parquet"))
    calling, plain = read_sft_examples(tmp_path / "calls.parquet", tokenizer)
    assert (calling.input_ids, calling.loss_mask) == (example.input_ids, example.loss_mask)
    assert plain.input_ids == row_to_example({"messages": CHAT}, "row", tokenizer).input_ids
    bare = row_to_example({"messages": CALLING}, "row", tokenizer)  # without the row's extras: another prompt
    assert bare.input_ids == tokenizer.encode(body, add_special_tokens=False)


def test_an_rl_prompt_renders_with_its_rows_tools_and_bad_ones_are_one_line(plain_tokenizer, tmp_path) -> None:
    """The engine's ids of a chat prompt whose row has tools and template variables (over the run's), and of one that
    ends with the assistant's prefilled start (continued, as TRL does); a ``tools`` field that is no list of schemas
    names the file and line."""
    import json

    from minirl.tasks.chat import apply_chat_setting, encode_prompt
    from minirl.tasks.jsonl import TaskDataError, read_jsonl_prompts

    tokenizer = _tools_tokenizer(plain_tokenizer)
    apply_chat_setting(tokenizer, "auto", {"style": "long"})
    path = tmp_path / "tools.jsonl"
    path.write_text(json.dumps({"prompt": CALLING[:1], "answer": "7", "tools": [ADD]}) + "\n"
                    + json.dumps({"prompt": CALLING[:1], "answer": "7", "chat_template_kwargs": {"style": "short"}}) + "\n")
    first, second = read_jsonl_prompts(path)
    assert encode_prompt(tokenizer, first) == tokenizer.encode("Tools: add Style: long\nUser: 3+4?\nAssistant: ",
                                                               add_special_tokens=False)
    assert encode_prompt(tokenizer, second) == tokenizer.encode("Style: short\nUser: 3+4?\nAssistant: ", add_special_tokens=False)
    assert first.meta["tools"] == [ADD]  # reward functions get the column, as TRL passes it
    with_switch = _tools_tokenizer(plain_tokenizer)  # verl's per-row thinking switch, a template variable
    with_switch.chat_template = "{% if enable_thinking %}Think. {% endif %}" + TOOLS
    thinking = Prompt(text="", answer="7", messages=CALLING[:1], meta={"enable_thinking": True})
    assert encode_prompt(with_switch, thinking) == with_switch.encode("Think. User: 3+4?\nAssistant: ",
                                                                      add_special_tokens=False)
    prefilled = Prompt(text="", answer="7", messages=[*CALLING[:1], {"role": "assistant", "content": "I add"}])
    assert encode_prompt(tokenizer, prefilled) == tokenizer.encode(  # TRL: the assistant's start continued
        "Style: long\nUser: 3+4?\nAssistant: I add", add_special_tokens=False)
    path.write_text(json.dumps({"prompt": CALLING[:1], "answer": "7", "enable_thinking": "yes"}) + "\n")
    with pytest.raises(TaskDataError, match=r'tools.jsonl:1: field "enable_thinking" must be true or false$'):
        read_jsonl_prompts(path)
    path.write_text(json.dumps({"prompt": CALLING[:1], "answer": "7", "tools": ["add"]}) + "\n")
    with pytest.raises(TaskDataError, match=r'tools.jsonl:1: field "tools" must be a list of function schemas \(objects\)$'):
        read_jsonl_prompts(path)
    path.write_text(json.dumps({"prompt": [{"role": "assistant", "content": None}], "answer": "7"}) + "\n")
    with pytest.raises(TaskDataError, match=r'tools.jsonl:1: field "prompt" message 0 must be an object with string "role"'):
        read_jsonl_prompts(path)


# ----------------------------------------------------------------------------- vLLM stops

# vLLM's SamplingParams fields (docs.vllm.ai, "Inference Parameters"; unchanged in 0.32)
VLLM_FIELDS = {"stop", "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens", "ignore_eos", "min_tokens"}


def test_vllm_stop_params_translate_our_stop_ids_and_strings() -> None:
    params = stop_params([2, 7], ("Done.",))
    assert set(params) <= VLLM_FIELDS
    assert params == {"stop_token_ids": [2, 7], "stop": ["Done."], "include_stop_str_in_output": True,
                      "skip_special_tokens": True, "ignore_eos": False, "min_tokens": 0}
    assert stop_params([2], ())["stop"] is None


def test_vllm_and_native_give_the_same_completion_for_the_same_sampled_tokens(plain_tokenizer) -> None:
    tokenizer = plain_tokenizer
    eos = tokenizer.eos_token_id
    sampled = tokenizer.encode("7\nUser: 5+5?\nAssistant: 10\n") + [eos]
    logp = -torch.arange(1, len(sampled) + 1, dtype=torch.float32)

    def native(stops: tuple[str, ...]) -> Completion:  # what NativeEngine.generate returns for `sampled`
        c = Completion(0, 0, [1], list(sampled), logp.clone(), "eos", text=tokenizer.decode(sampled, skip_special_tokens=True))
        return cut_at_stop_strings(c, tokenizer, stops)

    for stops in [(), ("User",), ("5?",)]:
        expected = native(stops)
        # vLLM stops at the stop-string token or the stop id, but may hand back a few tokens more
        for end in range(len(expected.completion_ids), len(sampled) + 1):
            vllm_text = tokenizer.decode(sampled[:end], skip_special_tokens=True)
            if stops:  # vLLM's text is never read: even one cut before the stop string (vLLM's default) works
                vllm_text = vllm_text[: vllm_text.index(stops[0])]
            got = finish_completion(Completion(0, 0, [1], sampled[:end], logp[:end].clone(), "length", text=vllm_text),
                                    tokenizer, [eos], stops)
            assert (got.completion_ids, got.text, got.finish_reason) == (expected.completion_ids, expected.text, expected.finish_reason)
            assert torch.equal(got.logp_rollout, expected.logp_rollout)
    # hand-checked: "User" ends inside the token "User: ", which is kept
    assert native(("User",)).text == "7\nUser: " and native(("User",)).finish_reason == "eos"
    assert native(()).text == "7\nUser: 5+5?\nAssistant: 10\n" and native(()).completion_ids[-1] == eos
