"""The thinking part of ``meridian demo``: one vLLM server (CPU build) with ``MeridianScheduler``
and ``MeridianThinkingProcessor`` serving the tiny reasoning model. The same prompts run under
each thinking-control rule, one rule per request through ``vllm_xargs``, and the table shows the
thinking tokens each rule saved, whether the answer still followed intact, and which rule the
request log says fired. The tiny model cannot judge answer quality, so the table claims none.

The scenarios (shared with the live tests): the tiny model reasons by counting down
(``think N answer M`` → ``N … 1``, ``</think>``, M letters), so its reasoning has no prose: no
``\n\n`` lines, no full stops. The scenarios name their own boundaries (for EAT a token whose
text contains a 0 or a 5 ends a line; for RPDI every token ends a sentence) and thresholds read
off the model's own signals under greedy decoding: next-token entropy ≈ 1.35 nats at every
countdown step (the filler-word mass), the end token's rank 15–170, and an EAT value ≈ 0.015
nats that hardly moves. Invariant: each scenario turns on exactly one rule, so the rule that
ended the reasoning is the one named.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meridian.demo.server import VllmServer, stream_chat, tiny_server_args
from meridian.offline.tiny import LETTERS, task_prompt
from meridian.vllm.names import (
    CLASS_ARG,
    CONFIG_KEY,
    LOGITS_PROCESSOR,
    THINKING_ARG,
    THINKING_BUDGET_ARG,
    THINKING_STOP_FIELDS,
)

#: Line and sentence ends for a countdown (the model has no punctuation).
COUNTDOWN_BOUNDARIES = {"line_end": ["0", "5"], "sentence_end": ["0", "5"]}

#: Every countdown token ends a sentence (RPDI checks at each).
EVERY_TOKEN_A_SENTENCE = {"line_end": [], "sentence_end": [str(d) for d in range(10)]}

#: The class under which the load-aware scenario runs: targets no request can meet, so its
#: recent TTFAT attainment is 0 after the first completion.
STRICT_CLASS = "strict"
LOAD_AWARE = {"budget_tokens": 40, "min_budget_tokens": 8, "attainment_floor": 0.9}

#: Server configuration (``--additional-config``'s ``meridian`` block) for every scenario.
SERVER_CONFIG: dict[str, Any] = {
    "classes": {
        "standard": {"ttft_ms": 60_000, "ttfat_ms": 600_000, "answer_tpot_ms": 10_000, "rank": 1},
        STRICT_CLASS: {
            "ttft_ms": 0.001,
            "ttfat_ms": 0.001,
            "answer_tpot_ms": 0.001,
            "rank": 0,
            # Every request of it is late from the start: it must be served (and counted as a
            # miss), not shed, for the load-aware control to see the attainment fall.
            "on_overload": "queue",
            "thinking_control": {"load_aware": LOAD_AWARE},
        },
    },
    "default_class": "standard",
    "priority_map": {},
}

#: Mode name → the request's ``vllm_xargs`` (``None``: none at all).
MODES: dict[str, dict[str, Any] | None] = {
    "off (no arguments)": None,
    "off (explicit)": {THINKING_ARG: "off"},
    "budget 12": {THINKING_BUDGET_ARG: 12},
    "eat": {THINKING_ARG: json.dumps({"eat": {"min_lines": 4}, "boundaries": COUNTDOWN_BOUNDARIES})},
    "proxy": {THINKING_ARG: json.dumps({"proxy": {"min_tokens": 5, "end_prob_threshold": None, "max_end_rank": 40}})},
    "rpdi": {
        THINKING_ARG: json.dumps(
            {
                "rpdi": {"min_tokens": 8, "high_entropy_nats": 1.4, "alpha": 0.3, "ratio_threshold": 2.0},
                "boundaries": EVERY_TOKEN_A_SENTENCE,
            }
        )
    },
    "load-aware (strict class)": {CLASS_ARG: STRICT_CLASS},
}

#: Extra server arguments: the processor next to the scheduler.
PROCESSOR_ARGS = ["--logits-processors", LOGITS_PROCESSOR]


def server_config_json(extra: dict[str, Any] | None = None) -> str:
    """``--additional-config`` for the scenarios (plus ``extra`` keys of the meridian block)."""
    return json.dumps({CONFIG_KEY: {**SERVER_CONFIG, **(extra or {})}})


#: The tiny fixture under Meridian's scheduler: 256-token contexts (a prompt and up to 200
#: tokens), a 4,096-token cache and up to 8 requests a batch.
SERVER_ARGS = tiny_server_args(max_model_len=256, kv_cache_tokens=4096, max_num_seqs=8, scheduler=True)
#: (thinking N, answer M) of each prompt.
PROMPTS = [(30, 5), (60, 5), (90, 5)]
#: Modes shown (the two "off" modes are one row; the load-aware row runs its class twice, so the
#: second request sees the class's attainment from the first).
SHOWN = ["off (no arguments)", "budget 12", "eat", "proxy", "rpdi", "load-aware (strict class)"]


def run_thinking(
    model: Path, cache_dir: Path, out_dir: Path, progress: Callable[[str], None] = print
) -> dict[str, Any]:
    """Runs every shown mode on every prompt; returns per-mode thinking tokens and answer checks."""
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "thinking-requests.jsonl"
    log.unlink(missing_ok=True)
    args = SERVER_ARGS + PROCESSOR_ARGS + ["--additional-config", server_config_json({"request_log_path": str(log)})]
    results: dict[str, Any] = {}
    with VllmServer(model, args, log_path=out_dir / "thinking-serve.log", cache_dir=cache_dir) as server:
        for mode in SHOWN:
            xargs = MODES[mode]
            extra = {"vllm_xargs": xargs} if xargs is not None else None
            thought, intact = [], []
            for n, m in PROMPTS:
                if mode.startswith("load-aware"):
                    # A first request of the class completes (and misses its target) before the
                    # measured one; the scheduler publishes the attainment, the worker reads it.
                    stream_chat(server.base_url, str(model), task_prompt(n, m), max_tokens=200, extra=extra)
                    time.sleep(0.6)
                r = stream_chat(server.base_url, str(model), task_prompt(n, m), max_tokens=200, extra=extra)
                thought.append(len(r.reasoning.split()))
                intact.append(r.status == 200 and r.content.split() == LETTERS[:m])
            results[mode] = {"thinking_tokens": thought, "answers_intact": all(intact)}
            progress(f"  {mode:<28} thinking tokens {thought}")
    time.sleep(0.5)
    stops = (
        [json.loads(line).get(THINKING_STOP_FIELDS[0]) for line in log.read_text().splitlines()] if log.exists() else []
    )
    named = ["none" if stop is None else str(stop) for stop in stops]
    results["stopped_by_counts"] = {name: named.count(name) for name in sorted(set(named))}
    return results


def render(results: dict[str, Any]) -> str:
    """The table: mean thinking tokens per mode, saved against control off, answers intact."""
    base = statistics.mean(results["off (no arguments)"]["thinking_tokens"])
    lines = [f"{'rule':<28}{'thinking tokens':>17}{'saved':>9}{'answers intact':>16}", "-" * 70]
    for mode in SHOWN:
        row = results[mode]
        mean = statistics.mean(row["thinking_tokens"])
        saved = "-" if mode.startswith("off") else f"{1 - mean / base:.0%}"
        tokens = "/".join(str(t) for t in row["thinking_tokens"])
        lines.append(f"{mode:<28}{tokens:>17}{saved:>9}{'yes' if row['answers_intact'] else 'NO':>16}")
    counts = ", ".join(f"{k}: {v}" for k, v in results["stopped_by_counts"].items())
    lines.append(f"request log, thinking_stopped_by: {counts}")
    return "\n".join(lines)


def run_part(model: Path, cache_dir: Path) -> dict[str, Any]:
    """The demo part: every rule on every prompt, printed as one table."""
    prompts = ", ".join(task_prompt(n, m) for n, m in PROMPTS)
    print(
        f"\nThinking control: vLLM's OpenAI server (CPU build) with MeridianScheduler and "
        f"MeridianThinkingProcessor; prompts {prompts}, one rule per request (vllm_xargs), thresholds "
        "set for the tiny model's countdown. The tiny model cannot judge accuracy: none is claimed.",
        flush=True,
    )
    results = run_thinking(model, cache_dir, cache_dir / "thinking", progress=lambda line: print(line, flush=True))
    print()
    print(render(results))
    return results
