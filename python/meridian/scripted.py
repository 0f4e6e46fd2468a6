"""The KV-pressure scenario: stock vLLM and Meridian side by side on scripted reasoning requests.

Both runs use vLLM's real scheduler classes (``AsyncScheduler`` and ``MeridianScheduler``) with
the same KV capacity, the same requests and the same scripted token streams, driven by
:class:`meridian.testing.harness.ScriptedEngine`. Time is counted in engine steps (1 step = 1 ms
of virtual time), so the latencies are "in steps". This is the foundation's main job until the
live demo exists; the tests reuse it.
"""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meridian._core import Config
from meridian.testing.harness import (
    EngineSpec,
    RunResult,
    ScriptedEngine,
    ScriptedRequest,
    WORD_IDS,
    build_scheduler,
    offline_environment,
    reasoning_script,
    tiny_model_dir,
)

#: SLO targets in steps for the scripted scenario (one class, so goodput is comparable).
SCENARIO_MERIDIAN_CONFIG: dict[str, Any] = {
    "classes": {
        "standard": {"ttft_ms": 40.0, "ttfat_ms": 300.0, "answer_tpot_ms": 2.0, "rank": 1},
    },
    "default_class": "standard",
    "priority_map": {"0": "standard"},
    "step_time": {"base_ms": 1.0, "per_prefill_token_ms": 0.001, "per_decode_request_ms": 0.001,
                  "per_context_token_ms": 0.0},
}


@dataclass(frozen=True)
class Scenario:
    """Shape of the KV-pressure workload (DESIGN §3's prototype numbers by default)."""

    num_requests: int = 40
    arrival_window_steps: int = 60
    prompt_tokens: tuple[int, int] = (16, 48)
    think_tokens: tuple[int, int] = (20, 160)
    answer_tokens: tuple[int, int] = (10, 60)
    kv_cache_tokens: int = 768
    block_size: int = 32  # vLLM's CPU attention wants multiples of 32; the live demo uses the same
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 256


def scenario_requests(scenario: Scenario, seed: int) -> list[ScriptedRequest]:
    """Seeded requests: uniform arrivals over the window, uniform lengths in the ranges."""
    rng = random.Random(seed)
    requests = []
    for i in range(scenario.num_requests):
        prompt_len = rng.randint(*scenario.prompt_tokens)
        prompt = [WORD_IDS[rng.randrange(len(WORD_IDS))] for _ in range(prompt_len)]
        script = reasoning_script(rng.randint(*scenario.think_tokens), rng.randint(*scenario.answer_tokens), seed=i)
        requests.append(
            ScriptedRequest(
                req_id=f"req-{i:03d}",
                arrival_step=rng.randrange(scenario.arrival_window_steps),
                prompt_token_ids=prompt,
                output_token_ids=script,
            )
        )
    return requests


def run_scenario(policy: str, seed: int, cache_dir: str | Path, scenario: Scenario = Scenario()) -> RunResult:
    """Runs ``policy`` (``vllm`` or ``meridian``) on the seeded scenario."""
    offline_environment(cache_dir)
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from meridian.vllm import MeridianScheduler

    classes: dict[str, type[Any]] = {"vllm": AsyncScheduler, "meridian": MeridianScheduler}
    if policy not in classes:
        raise ValueError(f"unknown policy {policy!r}; choose one of {sorted(classes)}")
    spec = EngineSpec(
        model_dir=tiny_model_dir(cache_dir),
        num_blocks=scenario.kv_cache_tokens // scenario.block_size + 1,  # block 0 is vLLM's null block
        block_size=scenario.block_size,
        max_num_seqs=scenario.max_num_seqs,
        max_num_batched_tokens=scenario.max_num_batched_tokens,
        additional_config={"meridian": SCENARIO_MERIDIAN_CONFIG},
    )
    scheduler = build_scheduler(classes[policy], spec)
    observer_config = Config.from_json(json.dumps(SCENARIO_MERIDIAN_CONFIG))
    return ScriptedEngine(scheduler, scenario_requests(scenario, seed), observer_config=observer_config).run()


def summarize(result: RunResult) -> dict[str, float]:
    """DESIGN §4 metrics of one run, latencies in steps."""
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
    num_tokens = sum(len(r.output_token_ids) for r in result.requests.values())
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
