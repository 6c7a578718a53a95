"""A character-level tokenizer made locally (no downloads), wrapped for Hugging Face.

One token per character: printable ASCII (space through ``~``), newline and tab, plus the special
tokens ``<pad>`` (id 0), ``<unk>`` (1), ``<bos>`` (2), ``<eos>`` (3). It is a ``tokenizers``
WordLevel model behind a pre-tokenizer that isolates every character, with a ``Fuse`` decoder
that joins tokens with nothing in between, so ``decode(encode(s)) == s`` exactly for any string
over the vocabulary (spaces and newlines included). Characters outside it encode as ``<unk>``.

Encoding adds no special tokens (no post-processor): a prompt's ids are its characters, and the
caller appends ``<eos>`` where a sequence ends. Saved with ``save_pretrained`` it loads back with
``AutoTokenizer.from_pretrained`` and behaves the same.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
UNK_TOKEN = "<unk>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, UNK_TOKEN, BOS_TOKEN, EOS_TOKEN)

# Printable ASCII, then the two whitespace controls our tasks may use.
CHARACTERS: tuple[str, ...] = tuple(chr(code) for code in range(32, 127)) + ("\n", "\t")


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer; the same ids on every call (the vocabulary is fixed)."""
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # `[\s\S]` matches every character, newline included; "isolated" keeps each as its own piece.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        clean_up_tokenization_spaces=False,
    )
    assert len(tokenizer) == len(SPECIAL_TOKENS) + len(CHARACTERS)
    return tokenizer


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int, int]:
    """``(pad_token_id, eos_token_id)``; raises ``ValueError`` when the tokenizer lacks either."""
    pad_id, eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    if eos_id is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has no eos token")
    if pad_id is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has no pad token (see ensure_pad_token)")
    return int(pad_id), int(eos_id)


def ensure_pad_token(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Give a tokenizer without a pad token the eos token as pad (as most RL trainers do)."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer {type(tokenizer).__name__} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
