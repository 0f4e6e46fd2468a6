"""The scripted part of ``meridian demo``: the KV-pressure scenario, stock vLLM and Meridian side
by side on scripted reasoning requests.

Both runs use vLLM's real scheduler classes (``AsyncScheduler`` and ``MeridianScheduler``) with
the same KV capacity, the same requests and the same scripted token streams, driven by the
offline engine loop (``meridian.offline.engine``). Time is virtual and every executed step takes
1 ms, so the latencies read "in steps". The tests reuse the scenario. Invariant: both policies see
the very same requests, scripts and KV capacity.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meridian._core import Config, __version__
from meridian.offline.engine import (
    EngineRun,
    EngineSpec,
    OfflineEngine,
    OfflineRequest,
    build_scheduler,
    offline_environment,
    scripted_request,
)
from meridian.offline.tiny import WORD_IDS, reasoning_script, tiny_model_dir
from meridian.replay.policies import MERIDIAN, STOCK, additional_config, policy_spec, scheduler_class

#: SLO targets in steps for the scripted scenario (one class, so goodput is comparable). Every
#: request is served (`queue`): this part is about preemptions under KV pressure, on the same
#: requests as stock vLLM; the replay part shows triage.
SCENARIO_MERIDIAN_CONFIG: dict[str, Any] = {
    "classes": {
        "standard": {"ttft_ms": 40.0, "ttfat_ms": 300.0, "answer_tpot_ms": 2.0, "rank": 1, "on_overload": "queue"},
    },
    "default_class": "standard",
    "priority_map": {"0": "standard"},
    "step_time": {
        "base_ms": 1.0,
        "per_prefill_token_ms": 0.001,
        "per_decode_request_ms": 0.001,
        "per_context_token_ms": 0.0,
    },
}
#: The two policies shown (names of ``meridian.replay.policies``).
POLICIES = (STOCK.name, MERIDIAN.name)

#: (metric key, label) of the table, in order.
ROWS = [
    ("preemptions_prefill", "preemptions: prefill"),
    ("preemptions_think", "preemptions: thinking"),
    ("preemptions_answer", "preemptions: answering"),
    ("answer_preemption_alarms", "answer preempted while thinking ran"),
    ("answer_stalls", "answer stalls (gap > 5x TPOT target)"),
    ("max_answer_gap", "longest answer gap [steps]"),
    ("ttft_p50", "TTFT p50 [steps]"),
    ("ttfat_mean", "TTFAT mean [steps]"),
    ("ttfat_p50", "TTFAT p50 [steps]"),
    ("ttfat_p99", "TTFAT p99 [steps]"),
    ("answer_tpot_mean", "answer TPOT mean [steps]"),
    ("goodput_frac", "met every target [fraction]"),
    ("throughput_tok_per_step", "throughput [tokens/step]"),
    ("steps", "steps to drain"),
]


@dataclass(frozen=True)
class Scenario:
    """Shape of the KV-pressure workload (docs/request-life.md §3's prototype numbers by default)."""

    num_requests: int = 40
    arrival_window_steps: int = 60
    prompt_tokens: tuple[int, int] = (16, 48)
    think_tokens: tuple[int, int] = (20, 160)
    answer_tokens: tuple[int, int] = (10, 60)
    kv_cache_tokens: int = 768
    block_size: int = 32  # vLLM's CPU attention wants multiples of 32; the live demo uses the same
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 256


def scenario_requests(scenario: Scenario, seed: int) -> list[OfflineRequest]:
    """Seeded requests: uniform arrivals over the window (1 step = 1 ms), uniform lengths."""
    rng = random.Random(seed)
    requests = []
    for i in range(scenario.num_requests):
        prompt_len = rng.randint(*scenario.prompt_tokens)
        prompt = [WORD_IDS[rng.randrange(len(WORD_IDS))] for _ in range(prompt_len)]
        script = reasoning_script(rng.randint(*scenario.think_tokens), rng.randint(*scenario.answer_tokens), seed=i)
        arrival_ms = float(rng.randrange(scenario.arrival_window_steps))
        requests.append(scripted_request(f"req-{i:03d}", arrival_ms, prompt, script))
    return requests


def scenario_spec(scenario: Scenario, cache_dir: str | Path, **additional: Any) -> EngineSpec:
    """The engine the scenario runs on (``additional``: vLLM's ``additional_config``)."""
    return EngineSpec(
        model_dir=tiny_model_dir(cache_dir),
        num_blocks=scenario.kv_cache_tokens // scenario.block_size + 1,  # block 0 is vLLM's null block
        block_size=scenario.block_size,
        max_num_seqs=scenario.max_num_seqs,
        max_num_batched_tokens=scenario.max_num_batched_tokens,
        additional_config=additional,
    )


def run_scenario(policy: str, seed: int, cache_dir: str | Path, scenario: Scenario = Scenario()) -> EngineRun:
    """Runs ``policy`` (``vllm-fcfs`` or ``meridian``, or any other replay policy) on the seeded
    scenario."""
    offline_environment(cache_dir)
    spec = policy_spec(policy)
    engine_spec = scenario_spec(scenario, cache_dir, **additional_config(spec, SCENARIO_MERIDIAN_CONFIG))
    engine_spec.policy = spec.vllm_policy
    scheduler = build_scheduler(scheduler_class(spec), engine_spec)
    observer_config = Config.from_json(json.dumps(SCENARIO_MERIDIAN_CONFIG))
    return OfflineEngine(scheduler, scenario_requests(scenario, seed), observer_config=observer_config).run()


def summarize(result: EngineRun) -> dict[str, float]:
    """docs/request-life.md §4 metrics of one run, latencies in steps."""
    reports = result.reports

    def values(attr: str) -> list[float]:
        return [v for v in (getattr(r, attr) for r in reports) if v is not None]

    def pct(xs: list[float], q: float) -> float:
        if not xs:
            return float("nan")
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]

    ttfat = values("ttfat_ms")
    ttft = values("ttft_ms")
    tpot = values("answer_tpot_ms")
    num_tokens = sum(len(t.token_times_ms) for t in result.timelines.values())
    return {
        "completed": float(len(reports)),
        "preemptions_prefill": float(sum(r.num_preemptions_prefill for r in reports)),
        "preemptions_think": float(sum(r.num_preemptions_think for r in reports)),
        "preemptions_answer": float(sum(r.num_preemptions_answer for r in reports)),
        "answer_preemption_alarms": float(result.num_answer_preemption_alarms),
        "answer_stalls": float(sum(r.num_stalls for r in reports)),
        "max_answer_gap": max((r.max_answer_gap_ms for r in reports), default=0.0),
        "ttft_p50": pct(ttft, 0.5),
        "ttfat_mean": statistics.fmean(ttfat) if ttfat else float("nan"),
        "ttfat_p50": pct(ttfat, 0.5),
        "ttfat_p99": pct(ttfat, 0.99),
        "answer_tpot_mean": statistics.fmean(tpot) if tpot else float("nan"),
        "goodput_frac": sum(r.met_all for r in reports) / max(1, len(reports)),
        "steps": float(result.num_steps),
        "throughput_tok_per_step": num_tokens / max(1.0, result.clock_ms),
    }


def run_part(seeds: list[int], cache_dir: Path) -> dict[str, object]:
    """The demo part: every seed under both policies, printed as one table."""
    scenario = Scenario()
    print(
        f"Meridian {__version__} demo: {scenario.num_requests} reasoning requests "
        f"({scenario.think_tokens[0]}-{scenario.think_tokens[1]} thinking + "
        f"{scenario.answer_tokens[0]}-{scenario.answer_tokens[1]} answer tokens) arriving over "
        f"{scenario.arrival_window_steps} steps into a {scenario.kv_cache_tokens}-token KV cache.\n"
        "vLLM's real schedulers, scripted model outputs, virtual time (1 step = 1 ms); latencies in steps.",
        flush=True,
    )
    results: dict[str, list[dict[str, float]]] = {policy: [] for policy in POLICIES}
    started = time.monotonic()
    total = len(seeds) * len(POLICIES)
    for i, seed in enumerate(seeds):
        for j, policy in enumerate(POLICIES):
            print(f"  [{i * len(POLICIES) + j + 1}/{total}] seed {seed}: {policy:<9} ...", end="", flush=True)
            results[policy].append(summarize(run_scenario(policy, seed, cache_dir, scenario)))
            print(f" {time.monotonic() - started:6.1f}s", flush=True)
    print()
    print(render(results, seeds))
    return {"seeds": seeds, "results": results}


def render(results: dict[str, list[dict[str, float]]], seeds: list[int]) -> str:
    """The side-by-side table, one cell per policy with every seed's value."""

    def fmt(v: float) -> str:
        if math.isnan(v):
            return "-"
        return f"{v:.0f}" if float(v).is_integer() else f"{v:.2f}"

    title = "metric (per seed: " + " / ".join(map(str, seeds)) + ")"
    rows = [(label, [" / ".join(fmt(m[key]) for m in results[p]) for p in POLICIES]) for key, label in ROWS]
    width = max(len(title), *(len(label) for label, _ in rows)) + 2
    cell = max(len("stock vLLM"), *(len(c) for _, cells in rows for c in cells)) + 3
    header = f"{title:<{width}}{'stock vLLM':>{cell}}{'Meridian':>{cell}}"
    lines = [header, "-" * len(header)]
    lines.extend(f"{label:<{width}}{cells[0]:>{cell}}{cells[1]:>{cell}}" for label, cells in rows)
    return "\n".join(lines)


__all__ = [
    "POLICIES",
    "SCENARIO_MERIDIAN_CONFIG",
    "Scenario",
    "run_part",
    "run_scenario",
    "scenario_requests",
    "scenario_spec",
    "summarize",
]
