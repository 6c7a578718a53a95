"""Build a small model directory as a user would have one: a byte-level BPE tokenizer with a chat
template, trained here with ``tokenizers`` on the example's data, and a tiny Qwen3-MoE made from a
config (random weights). No downloads.

    python examples/chat_math/build_model.py examples/chat_math/model

The directory loads with plain ``AutoTokenizer`` / ``AutoModelForCausalLM``. Like many instruct
models it stops at two tokens: the tokenizer's EOS (``<|endoftext|>``) and the chat's end of turn
(``<|im_end|>``), both listed in ``generation_config.json``; the tokenizer prepends BOS to plain
text, and the chat template writes BOS itself.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

HERE = Path(__file__).resolve().parent
SPECIAL = ["<pad>", "<s>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def corpus(data_dir: Path) -> list[str]:
    """Every text of the example's data files (the tokenizer learns their pieces)."""
    texts = []
    for name in ("train.jsonl", "sft.jsonl"):
        for line in (data_dir / name).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            for message in row.get("prompt", []) + row.get("messages", []):
                texts.append(message["content"])
            texts.append(str(row.get("answer", "")))
    return texts


def build_tokenizer(texts: list[str], vocab_size: int = 400) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(texts, trainer=trainer)
    bos = backend.token_to_id("<s>")
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
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
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=stop, pad_token_id=tokenizer.pad_token_id
    )
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", nargs="?", default=str(HERE / "model"))
    parser.add_argument("--data", default=str(HERE / "data"))
    args = parser.parse_args()
    tokenizer = build_tokenizer(corpus(Path(args.data)))
    model = build_model(tokenizer)
    model.save_pretrained(args.output)
    tokenizer.save_pretrained(args.output)
    print(f"wrote {args.output}: vocabulary {len(tokenizer)}, {sum(p.numel() for p in model.parameters()):,} parameters")


if __name__ == "__main__":
    main()
