"""Build a small model directory whose chat template writes tools, tool calls and tool results the way Qwen's does
(Hermes ``<tool_call>`` blocks, results in ``<tool_response>``): a byte-level BPE tokenizer trained here on the
example's conversations, rendered through that template, and a tiny Qwen3-MoE from a config (random weights).

    python examples/tool_calling/build_model.py examples/tool_calling/model

It stops at the chat's end of turn (``<|im_end|>``) and at its EOS, both in ``generation_config.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3MoeConfig, Qwen3MoeForCausalLM

HERE = Path(__file__).resolve().parent
SPECIAL = ["<pad>", "<s>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (  # Qwen's layout, shortened: the tools listed by name in a system turn
    "{{ bos_token }}"
    "{% if tools %}<|im_start|>system\nTools:"
    "{% for tool in tools %} {{ tool.function.name }}({{ tool.function.parameters.properties | list | join(', ') }})"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'tool' %}<|im_start|>user\n<tool_response>{{ message.content }}</tool_response><|im_end|>\n"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content or '' }}"
    "{% for call in message.tool_calls or [] %}<tool_call>{\"name\": \"{{ call.function.name }}\", \"arguments\": "
    "{{ call.function.arguments | tojson }}}</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(data_dir: Path, vocab_size: int = 600) -> PreTrainedTokenizerFast:
    """A BPE tokenizer learnt on the example's conversations as the template renders them."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    rows = [json.loads(line) for line in (data_dir / "sft.jsonl").read_text(encoding="utf-8").splitlines()]
    scratch = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), bos_token="<s>")
    scratch.chat_template = CHAT_TEMPLATE
    texts = [scratch.apply_chat_template(row["messages"], tokenize=False) for row in rows]
    backend.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="<|endoftext|>", pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"], clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> Qwen3MoeForCausalLM:
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, intermediate_size=128,
        max_position_embeddings=256, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config)
    stop = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id]
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=stop,
                                               pad_token_id=tokenizer.pad_token_id)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", nargs="?", default=str(HERE / "model"))
    parser.add_argument("--data", default=str(HERE / "data"))
    args = parser.parse_args()
    tokenizer = build_tokenizer(Path(args.data))
    model = build_model(tokenizer)
    model.save_pretrained(args.output)
    tokenizer.save_pretrained(args.output)
    print(f"wrote {args.output}: vocabulary {len(tokenizer)}, {sum(p.numel() for p in model.parameters()):,} parameters")


if __name__ == "__main__":
    main()
