"""Train the tiny reasoning-format model the live tests and the demo serve (seeded, a few minutes
on 2 CPU cores; no model hub).

The task makes the prompt control both phases. The prompt ``think N answer M`` (N in 1–99,
M in 1–26) asks for a countdown ``N … 1`` as the reasoning — with filler words ("so", "hmm",
"wait", …) sprinkled in at random, so next-token entropy is not trivially zero — then
``</think>``, then the first M letters ``a b c …`` as the answer, then EOS (``<|im_end|>``).
Greedy decoding therefore thinks for about N·1.35 tokens and answers with exactly M. The task's
format (prompt and completion words) lives in ``meridian.offline.tiny``; this script, which needs
``transformers`` and trains with torch, is a development tool and not part of the package.

    python scripts/train_tiny.py OUT_DIR [--shape tiny|compute|long] [--steps 1500] [--seed 0] [--half]

``--shape long`` (``tests/fixtures/long-reasoner``) extends the vocabulary with the numbers
100-999 (every tiny token keeps its id) and trains on countdowns up to 999 in batches of one
length band each (within a factor of two, drawn log-uniformly), so a batch pads little; greedy
decoding never picks a filler, so it thinks for exactly N tokens (checked up to 990).

Invariant: the same seed, step count and torch build give the same weights; the written folder
is a complete model vLLM loads (config, tokenizer, chat template, safetensors weights).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

from meridian.offline.tiny import MAX_ANSWER, MAX_NUMBER, MAX_THINK, MODEL_SHAPES, completion_words, prompt_words, vocabulary, write_tiny_model


def make_example(rng: random.Random, vocab: dict[str, int], think_range: tuple[int, int] = (1, MAX_THINK)) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of one training sequence; the loss covers the completion only."""
    num_think = rng.randint(*think_range)
    num_answer = rng.randint(1, MAX_ANSWER)
    prompt = [vocab[w] for w in prompt_words(num_think, num_answer)]
    completion = [vocab[w] for w in completion_words(num_think, num_answer, rng)]
    return prompt + completion, [0] * len(prompt) + [1] * len(completion)


def _think_band(rng: random.Random, max_number: int) -> tuple[int, int]:
    """The countdown lengths of one batch: every length of the task for the tiny vocabulary; for a
    longer one a band of lengths within a factor of two, its start drawn log-uniformly, so a batch
    pads little and every number up to ``max_number`` is counted down from often enough."""
    if max_number <= MAX_THINK:
        return 1, max_number
    low = max(1, int(math.exp(rng.uniform(0.0, math.log(max_number)))))
    return low, min(max_number, 2 * low)


def train(out_dir: str | Path, *, shape: str = "tiny", steps: int = 1500, seed: int = 0, batch_size: int = 32, lr: float = 3e-3,
          half: bool = False) -> Path:
    """Trains from scratch and writes the model folder; returns its path. ``half`` stores the
    weights as float16 (half the file; vLLM casts them back with ``--dtype float32``)."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    max_number = MAX_NUMBER[shape]
    out = write_tiny_model(out_dir, shape=MODEL_SHAPES[shape], max_position_embeddings=512 if max_number <= MAX_THINK else 2048,
                           max_number=max_number)
    config_dict = json.loads((out / "config.json").read_text())
    vocab = vocabulary(max_number)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    config = Qwen3Config(**{k: v for k, v in config_dict.items() if k not in ("architectures", "model_type", "torch_dtype")})
    model = Qwen3ForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps, pct_start=0.1)
    pad = vocab["<|endoftext|>"]
    started = time.monotonic()
    for step in range(steps):
        examples = [make_example(rng, vocab, think_range) for think_range in [_think_band(rng, max_number)] * batch_size]
        width = max(len(ids) for ids, _ in examples)
        ids = torch.full((batch_size, width), pad, dtype=torch.long)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)
        attention = torch.zeros((batch_size, width), dtype=torch.long)
        for row, (tokens, mask) in enumerate(examples):
            n = len(tokens)
            ids[row, :n] = torch.tensor(tokens)
            attention[row, :n] = 1
            labels[row, :n] = torch.tensor([t if m else -100 for t, m in zip(tokens, mask)])
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"step {step:5d}  loss {loss.item():.4f}  {time.monotonic() - started:6.1f}s", flush=True)
    dtype = torch.float16 if half else torch.float32
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def write_manifest(out_dir: Path, made_by: str) -> None:
    """``MANIFEST.json``: the command that made the folder, the torch build, every file's sha256
    (the fixture test checks them)."""
    import hashlib

    import torch

    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out_dir.iterdir()) if p.name != "MANIFEST.json"}
    manifest = {"made_by": made_by, "torch": torch.__version__, "sha256": digests}
    (out_dir / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shape", choices=sorted(MODEL_SHAPES), default="tiny")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--half", action="store_true", help="store float16 weights")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    train(args.out_dir, shape=args.shape, steps=args.steps, seed=args.seed, lr=args.lr, half=args.half)
    write_manifest(args.out_dir, "python scripts/train_tiny.py " + " ".join(sys.argv[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
