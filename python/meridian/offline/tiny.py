"""The tiny reasoning model's format: its vocabulary, its model folder and its task.

``write_tiny_model(path, shape=...)`` writes a Qwen3-architecture ``config.json`` in one of
``MODEL_SHAPES`` (head sizes 32 and 64, which vLLM's CPU attention accepts) and a word-level tokenizer whose vocabulary has the reasoning
markers ``<think>`` / ``</think>`` and a ``<tool_call>`` marker, plus a ChatML chat template that
opens ``<think>`` for the assistant. That is enough for vLLM to build its configs, its
``ReasoningConfig`` (``--reasoning-parser deepseek_r1``) and its scheduler offline (no model hub
is reachable here). The task the trained fixture (``tests/fixtures/tiny-reasoner``, made by
``scripts/train_tiny.py``) learned: the prompt ``think N answer M`` asks for a countdown
``N … 1`` with filler words as the reasoning, then ``</think>``, then the first M letters as the
answer, then EOS. The offline engine scripts its outputs in the same tokens. Invariant: the
output depends only on the arguments, so two calls write byte-identical files.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: Special tokens, in id order from 0.
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<unk>",
]
#: Added tokens that stay visible in decoded text (the reasoning parser reads them).
MARKER_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
#: Ordinary words: counting words for the reasoning and digits/letters for answers.
WORDS = (
    [str(i) for i in range(100)]
    + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    + [
        "think",
        "count",
        "down",
        "answer",
        "with",
        "tokens",
        "then",
        "stop",
        "user",
        "assistant",
        "system",
        "so",
        "next",
        "step",
        "done",
        "ok",
        "the",
        "is",
        "a",
        "of",
        "and",
        "to",
        "in",
        "it",
        "that",
        "let",
        "me",
        "check",
        "again",
        "wait",
        "hmm",
        "right",
        "yes",
        "no",
        "because",
    ]
)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + ' ' + message['content'] + ' <|im_end|> ' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant <think> ' }}{% endif %}"
)


def vocabulary(max_number: int = 99) -> dict[str, int]:
    """Token → id map of the tiny tokenizer (duplicates removed, first occurrence wins). With
    ``max_number`` above 99 the numbers 100 … ``max_number`` follow the tiny vocabulary, so every
    token keeps the id it has in the tiny model (the offline engine's scripted ids hold for both)."""
    vocab: dict[str, int] = {}
    for token in SPECIAL_TOKENS + WORDS + [str(i) for i in range(100, max_number + 1)]:
        vocab.setdefault(token, len(vocab))
    return vocab


@dataclass(frozen=True)
class ModelShape:
    """A Qwen3 shape the tiny task is trained in (``scripts/train_tiny.py --shape NAME``)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    intermediate_size: int


#: The shapes of the two trained fixtures. ``tiny`` (``tests/fixtures/tiny-reasoner``): a decode
#: step is almost all vLLM's own Python (about 5 ms at batch 16 on one core). ``compute``
#: (``tests/fixtures/compute-reasoner``): head size 64, four layers, about 4 M parameters, so a
#: decode step at batch 16 is about 15 ms on one core and mostly matrix products — the
#: proportions between model time and scheduler time a GPU server has.
MODEL_SHAPES = {
    "tiny": ModelShape(hidden_size=64, num_layers=2, num_heads=2, head_dim=32, intermediate_size=128),
    "compute": ModelShape(hidden_size=256, num_layers=4, num_heads=4, head_dim=64, intermediate_size=1024),
    # ``long`` (``tests/fixtures/long-reasoner``): the tiny shape, wider for its thousand-number
    # vocabulary; it counts down from up to ``LONG_MAX_THINK``, so it thinks for up to ~1,350 tokens.
    "long": ModelShape(hidden_size=128, num_layers=2, num_heads=4, head_dim=32, intermediate_size=256),
}
#: The largest countdown of each shape's task (its vocabulary's largest number).
MAX_NUMBER = {"tiny": 99, "compute": 99, "long": 999}


def write_tiny_model(
    path: str | Path,
    *,
    shape: ModelShape = MODEL_SHAPES["tiny"],
    max_position_embeddings: int = 4096,
    max_number: int = 99,
) -> Path:
    """Writes ``config.json``, ``tokenizer.json``, ``tokenizer_config.json`` and
    ``generation_config.json`` into ``path`` and returns it (``max_number``: ``vocabulary``'s)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary(max_number)
    tokenizer = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    # The reasoning and tool-call markers are added tokens (always matched whole) but not special
    # ones: as in DeepSeek-R1's and Qwen3's tokenizers they survive detokenization, which is what
    # vLLM's reasoning parsers read to split reasoning from content.
    tokenizer.add_special_tokens([t for t in SPECIAL_TOKENS if t not in MARKER_TOKENS])
    tokenizer.add_tokens(MARKER_TOKENS)
    _replace_atomically(out / "tokenizer.json", lambda tmp: tokenizer.save(str(tmp)))

    eos_id = vocab["<|im_end|>"]
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": _round_up(len(vocab), 64),
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_heads,
        "head_dim": shape.head_dim,
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "bos_token_id": vocab["<|endoftext|>"],
        "eos_token_id": eos_id,
        "attention_bias": False,
        "attention_dropout": 0.0,
    }
    _write_json(out / "config.json", config)
    _write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|endoftext|>",
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": "<unk>",
            "model_max_length": max_position_embeddings,
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
        },
    )
    _write_json(out / "generation_config.json", {"eos_token_id": eos_id, "bos_token_id": vocab["<|endoftext|>"]})
    return out


def write_random_model(
    path: str | Path, *, seed: int, shape: ModelShape = MODEL_SHAPES["compute"], max_position_embeddings: int = 1024
) -> Path:
    """The tiny model's files with seeded random weights (N(0, 0.05)) instead of trained ones:
    a model whose every output token depends on its whole KV cache. The trained fixtures count
    down from the last token alone and ignore their KV, so they cannot show that KV restored from
    a tier is the KV that was stored; corrupt this one's and its greedy output changes."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = write_tiny_model(path, shape=shape, max_position_embeddings=max_position_embeddings)
    config = Qwen3Config.from_pretrained(out)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "norm" not in name:
                tensor.normal_(0.0, 0.05)
    model.save_pretrained(out, safe_serialization=True)
    return out


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def _write_json(path: Path, payload: dict[str, object]) -> None:
    text = json.dumps(payload, indent=2, sort_keys=True) + "\n"
    _replace_atomically(path, lambda tmp: tmp.write_text(text))


def _replace_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """``write`` to a file beside ``path``, then renamed over it: a process loading the folder
    meanwhile (another test worker, a server) reads the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def tiny_model_dir(cache_dir: str | Path) -> Path:
    """The tiny model folder under ``cache_dir`` (rewritten each call: a few ms, and a cache left
    by an older version can never go stale)."""
    return write_tiny_model(Path(cache_dir) / "tiny-reasoner")


# ---- token ids the offline engine scripts outputs in ---------------------------------------

VOCAB = vocabulary()
THINK_START = VOCAB["<think>"]
THINK_END = VOCAB["</think>"]
TOOL_CALL = VOCAB["<tool_call>"]
EOS = VOCAB["<|im_end|>"]
#: Reasoning words and answer tokens of scripted outputs.
WORD_IDS = [VOCAB[w] for w in ("count", "down", "next", "step", "ok", "so", "wait", "check")]
ANSWER_IDS = [VOCAB[str(i)] for i in range(10)]


# ---- the task the trained fixture learned ---------------------------------------------------

FILLERS = ["so", "hmm", "ok", "wait", "check", "next", "step"]
FILLER_PROBABILITY = 0.35
MAX_THINK = 99
MAX_ANSWER = 26
#: The answer alphabet: ``answer M`` is the first M letters.
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]


def task_prompt(num_think: int, num_answer: int) -> str:
    """The user message that asks for ``num_think`` countdown steps and ``num_answer`` letters."""
    return f"think {num_think} answer {num_answer}"


def prompt_words(num_think: int, num_answer: int) -> list[str]:
    """The chat-templated prompt, as whitespace-separated tokens (ends with the open ``<think>``)."""
    return [
        "<|im_start|>",
        "user",
        *task_prompt(num_think, num_answer).split(),
        "<|im_end|>",
        "<|im_start|>",
        "assistant",
        "<think>",
    ]


def completion_words(num_think: int, num_answer: int, rng: random.Random) -> list[str]:
    """Countdown reasoning with random fillers, ``</think>``, M letters, EOS."""
    words: list[str] = []
    for k in range(num_think, 0, -1):
        words.append(str(k))
        if k > 1 and rng.random() < FILLER_PROBABILITY:
            words.append(rng.choice(FILLERS))
    return words + ["</think>"] + LETTERS[:num_answer] + ["<|im_end|>"]


def reasoning_script(num_think: int, num_answer: int, *, seed: int = 0, tool_call: bool = False) -> list[int]:
    """Scripted output tokens: ``num_think`` reasoning words, ``</think>``, ``num_answer`` answer
    tokens (the first a tool-call marker when asked), EOS."""
    think = [WORD_IDS[(seed + i) % len(WORD_IDS)] for i in range(num_think)]
    answer = [ANSWER_IDS[(seed * 7 + i) % len(ANSWER_IDS)] for i in range(num_answer)]
    if tool_call and answer:
        answer[0] = TOOL_CALL
    return think + [THINK_END] + answer + [EOS]
