"""Replay: the device prefix cache under reasoning traffic — how much of the prompts vLLM's own
prefix cache serves (``vllm:prefix_cache_hits`` / ``queries``: prompt tokens found cached at
admission, resumed preemptions left out) with stock vLLM and with Meridian, and what each of
Meridian's two cache rules contributes:

- ``meridian``: the defaults — a finished request's never-reusable reasoning blocks leave the
  cache first (DESIGN §3's first eviction tier) and prefix-aware admission (``prefix_affinity``);
- ``meridian, reasoning kept``: ``evict_reasoning_blocks: never`` (dead reasoning stays cached as
  vLLM keeps it; the analogue of SGLang's baseline against its ``--strip-thinking-cache``, which
  took QwQ-32B's hit rate from 11.1 % to 17.1 %);
- ``meridian, no affinity``: ``prefix_affinity.enabled: false``.

Workloads:

- ``multiturn``: reasoning chat, the case the first eviction tier is for. Conversations start at
  the Azure conversation trace's arrival times (real arrivals, 120 s from 600 s), each with a
  first prompt of its request's real context length; a conversation has 1 + Geometric turns
  (mean ``MEAN_TURNS``), the next turn arriving an exponential pause (mean ``MEAN_PAUSE_S``)
  after the previous one; a later turn's prompt is the previous prompt, the previous *answer* and
  a new user message whose length is drawn from the same trace's context lengths — the previous
  *thinking* is dropped, as reasoning models' chat templates drop it; thinking and answer lengths
  of every turn are ServeGen's production DeepSeek-R1 samples. The turn count and pause are
  stated assumptions (no public trace has both reasoning and conversation structure); results
  are labelled "real arrivals + production-derived lengths + synthetic conversation structure".
  H200 / Qwen3-32B-class profile (its KV holds ~280 k tokens: conversations compete for it).
- ``mooncake`` (``bench/replay_ab.py``'s): real arrivals and real prefix reuse between requests,
  production-derived reasoning lengths, 8B profile. Its prompts average 15 k tokens against ~1 k
  of thinking, so dead reasoning is a small share of its KV.
- ``azure`` (``bench/replay_ab.py``'s, no prefix information: every prompt is its own): checks
  that the rules cost nothing where nothing repeats.

The scripted model's thinking never reappears in a later prompt, exactly as under a chat template
that drops it. Virtual time: the numbers do not depend on this machine's speed.

    .venv/bin/python bench/replay_prefix_cache.py [--workloads mooncake azure] [--load-factors 1 2]
        [--start-s S --duration-s D] [--json PATH]

``--start-s 0`` replays Mooncake's conversations from the trace's start: the default window (from
120 s) begins with an empty cache while its conversations' earlier turns are not replayed, so at
most 7.8 % of its prompt blocks could hit any cache; from 0 s over 270 s, 16.7 %.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from development import HALF_LOAD, SHARED, workloads, write_results  # noqa: E402
from meridian.replay import reasoning, traces  # noqa: E402
from meridian.replay.runner import ReplayOptions, run_replay  # noqa: E402

#: The multi-turn workload's stated assumptions: turns per conversation (mean of 1 + Geometric)
#: and the pause between a turn's arrival and the next's (mean of an exponential), seconds.
MEAN_TURNS = 3.0
MEAN_PAUSE_S = 60.0
#: Tokens per hashed block of the generated trace (vLLM's block size on the profiles).
HASH_BLOCK_TOKENS = 16
#: The window of the Azure conversation trace whose arrivals start conversations, seconds.
MULTITURN_START_S, MULTITURN_DURATION_S = 600.0, 1800.0
#: The share of those arrivals that start a conversation at about FCFS's 50 % load (probed: FCFS
#: attainment 94 % at 0.02, 35 % at 0.04).
MULTITURN_HALF_LOAD = 0.03

#: Label → Meridian config keys on top of the workload's classes (None: stock vLLM FCFS).
VARIANTS: dict[str, dict[str, Any] | None] = {
    "vllm-fcfs": None,
    "meridian": {},
    "meridian, reasoning kept": {"evict_reasoning_blocks": "never"},
    "meridian, no affinity": {"prefix_affinity": {"enabled": False}},
}


def multiturn_trace(path: Path, share: float, seed: int = 0, max_prompt_tokens: int = 24_000) -> Path:
    """Writes the multi-turn workload (see the module docs) as a Meridian JSONL trace: a seeded
    ``share`` of the window's conversation starts (the load is set by how many conversations
    start, not by stretching time, which would stretch the pauses between turns too)."""
    rng = np.random.default_rng(seed)
    trace = traces.load_azure(SHARED / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv")
    window = traces.window(trace, MULTITURN_START_S, MULTITURN_DURATION_S)
    user_lengths = np.asarray([r.num_prompt_tokens for r in window])
    conv = [r for r, keep in zip(window, rng.random(len(window)) < share) if keep]
    turns: list[tuple[float, int, int, int]] = []  # arrival, conversation, turn, new user tokens
    for c, first in enumerate(conv):
        arrival = first.arrival_ms
        for k in range(int(rng.geometric(1.0 / MEAN_TURNS))):  # 1, 2, ... turns, mean MEAN_TURNS
            user = first.num_prompt_tokens if k == 0 else int(rng.choice(user_lengths))
            turns.append((arrival, c, k, user))
            arrival += float(rng.exponential(MEAN_PAUSE_S * 1000.0))
    turns.sort(key=lambda t: (t[1], t[2]))
    # ServeGen's thinking and answer for every turn, drawn in (conversation, turn) order.
    placeholders = [traces.TraceRequest(req_id=f"c{c}-t{k}", arrival_ms=0.0, num_prompt_tokens=1, num_output_tokens=1,
                                        num_think_tokens=None, num_answer_tokens=None) for _, c, k, _ in turns]
    splits = reasoning.apply_reasoning_lengths(placeholders, "servegen", seed=seed, servegen=None)
    history: dict[int, int] = {}  # conversation -> its next prompt's history (prompt + answer so far)
    records = []
    for (arrival, c, k, user), split in zip(turns, splits):
        if k and c not in history:
            continue  # the conversation outgrew the context: it ends there
        num_prompt = history.pop(c, 0) + user
        if num_prompt > max_prompt_tokens:
            continue
        # The history a chat template rebuilds: this prompt and its answer, not its thinking.
        history[c] = num_prompt + int(split.num_answer_tokens or 0)
        num_blocks = -(-num_prompt // HASH_BLOCK_TOKENS)
        records.append({"req_id": f"c{c}-t{k}", "arrival_ms": arrival, "num_prompt_tokens": num_prompt,
                        "num_think_tokens": split.num_think_tokens, "num_answer_tokens": split.num_answer_tokens,
                        "prefix_block_hashes": [c * 1_000_000 + b for b in range(num_blocks)],
                        "hash_block_size": HASH_BLOCK_TOKENS, "source": "chat"})
    records.sort(key=lambda r: r["arrival_ms"])
    origin = records[0]["arrival_ms"]
    with path.open("w") as out:
        for r in records:
            out.write(json.dumps({**r, "arrival_ms": r["arrival_ms"] - origin}) + "\n")
    return path


def multiturn_options(path: Path, share: float) -> ReplayOptions:
    options = workloads(0)["azure"].options
    return replace(options, traces=(multiturn_trace(path, share),), trace_format="meridian", reasoning="trace",
                   classes="mix:interactive=0.3,standard=0.7", start_s=0.0, duration_s=None)


def run_variant(options: Any, scale: float, variant: dict[str, Any] | None) -> dict[str, Any]:
    if variant is None:
        report = run_replay(replace(options, rate_scales=(scale,), policies=("vllm-fcfs",), jobs=1))
    else:
        config = {**options.meridian_config, **variant}
        report = run_replay(replace(options, rate_scales=(scale,), policies=("meridian",), meridian_config=config,
                                    jobs=1))
    return report.runs[0].summary


def row(label: str, s: dict[str, Any], base: dict[str, Any]) -> str:
    cache = s["prefix_cache"]
    hit = cache["hit_rate"] or 0.0
    ttft = s["ttft_ms"]
    ratio = s["goodput_rps"] / base["goodput_rps"] if base["goodput_rps"] else float("nan")
    return (f"{label:<26} {hit * 100:>7.1f}% {cache['hits']:>13,} {s['goodput_rps']:>9.3f} {ratio:>6.2f} "
            f"{ttft['p50'] / 1000:>8.2f} {ttft['p99'] / 1000:>8.2f} {s['ttfat_ms']['p99'] / 1000:>9.1f} "
            f"{s['throughput_tok_s']:>8.0f}")


def run(name: str, factors: list[float], start_s: float | None, duration_s: float | None,
        scratch: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for factor in factors:
        if name == "multiturn":  # the load is the share of conversation starts; time is not stretched
            options = multiturn_options(scratch / f"multiturn-{factor:g}.jsonl", MULTITURN_HALF_LOAD * factor)
            scale = 1.0
        else:
            options, scale = workloads(0)[name].options, HALF_LOAD[name] * factor
            if start_s is not None:
                options = replace(options, start_s=start_s)
            if duration_s is not None:
                options = replace(options, duration_s=duration_s)
        rows = {label: run_variant(options, scale, variant) for label, variant in VARIANTS.items()}
        window = "" if options.duration_s is None else f", window {options.start_s:g} s + {options.duration_s:g} s"
        load = f"share {MULTITURN_HALF_LOAD * factor:g}" if name == "multiturn" else f"×{scale:.4g}"
        print(f"\n=== {name} {load} (FCFS ~50 % load × {factor:g}), profile {options.profile}{window}")
        print(f"{'policy':<26} {'hit rate':>8} {'hit tokens':>13} {'goodput/s':>9} {'×fcfs':>6} "
              f"{'TTFT p50':>8} {'TTFT p99':>8} {'TTFAT p99':>9} {'tok/s':>8}   (latencies in s)")
        for label, summary in rows.items():
            print(row(label, summary, rows["vllm-fcfs"]))
        out[f"x{factor:g}"] = {"rate_scale": scale, "rows": rows}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["multiturn", "mooncake", "azure"])
    parser.add_argument("--load-factors", nargs="+", type=float, default=[1.0, 2.0])
    parser.add_argument("--start-s", type=float, default=None, help="trace window start (default: replay_ab's)")
    parser.add_argument("--duration-s", type=float, default=None, help="trace window length (default: replay_ab's)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    started = time.time()
    with tempfile.TemporaryDirectory() as scratch:
        results: dict[str, Any] = {name: run(name, args.load_factors, args.start_s, args.duration_s, Path(scratch))
                                   for name in args.workloads}
    print(f"\n({time.time() - started:.0f} s wall)")
    write_results(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
