"""The live part of ``meridian demo``: a short run of the live A/B (``bench/live_ab.py``) — vLLM's
OpenAI-compatible server (CPU build) serving the tiny reasoning model with the stock scheduler,
then with ``MeridianScheduler``, each under the same seeded three-class workload that aiperf (a
real load generator) replays open-loop on its timestamps, one round per policy, with a progress
display. The arrival rate is calibrated on the machine first: ``OVERLOAD_FACTOR`` times what a
stock server completes under a burst (``measure_capacity_rps``), so the rounds run past the knee
on a fast machine and a slow one alike. The table puts side by side what aiperf measured: time to first output (answer) token,
time to first token, answer inter-token latency, throughput, goodput against each class's
targets, failed requests, and preemptions (vLLM's ``/metrics``; by phase from Meridian's request
log). Invariant: both servers get the same arguments but the scheduler's, the same dataset, the
same core placement (``meridian.demo.loadgen``); the demo only reports.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

from meridian.demo.loadgen import LIVE_MODELS, RoundSettings, Workload, find_aiperf, measure_capacity_rps, run_round
from meridian.replay.policies import MERIDIAN, STOCK

#: The tiny model fixture, relative to a source checkout's root (the README's commands run there).
DEFAULT_MODEL = Path(LIVE_MODELS["tiny"].folder)
#: The demo's arrival rate over the stock server's measured capacity (``measure_capacity_rps``):
#: past the knee on any machine. On 2026-12-05 the burst measured 20.4–20.9/s and the knee lay
#: between 20/s and 26/s (``bench/results/live_sweep_tiny_2026-12-05``); 1.5x is ~31/s, the
#: live A/B's 32/s. On 2026-12-01's slower machine the same rule gives ~19/s, past that day's
#: 14/s knee.
OVERLOAD_FACTOR = 1.5
#: Seconds of arrivals the demo's workload spans.
DEMO_SCHEDULE_S = 20.0

#: (row key, label, format) of the table, in order.
ROWS = [
    ("ttfo_p50_ms", "TTFO p50 [ms] (first answer token)", "{:.0f}"),
    ("ttfo_p99_ms", "TTFO p99 [ms]", "{:.0f}"),
    ("ttft_p50_ms", "TTFT p50 [ms]", "{:.0f}"),
    ("ttft_p99_ms", "TTFT p99 [ms]", "{:.0f}"),
    ("answer_itl_p99_ms", "answer ITL p99 [ms]", "{:.1f}"),
    ("output_tok_s", "output throughput [tokens/s]", "{:.0f}"),
    ("goodput_rps", "goodput [requests/s, class targets]", "{:.2f}"),
    ("good_requests", "requests within their class targets", "{:.0f}"),
    ("interactive_good", "  of which interactive", "{:.0f}"),
    ("failed", "failed requests", "{:.0f}"),
    ("shed", "shed by triage (HTTP 429 + Retry-After)", "{:.0f}"),
    ("preemptions", "preemptions (vLLM /metrics)", "{:.0f}"),
    ("preemptions_answer", "  of which answering (Meridian ledger)", "{:.0f}"),
    ("speed_probe", "machine speed probe, before / after [ms]", "{}"),
]
#: Printed under the table: why one round each is a demonstration, not a measurement.
ONE_ROUND_CAVEAT = (
    "One round per scheduler, a demonstration rather than a measurement: past the knee, how long a queue "
    "builds depends on the machine's speed during that round (the speed probe need not show it), so one "
    "round's pooled percentiles can mislead; the per-class rows, the sheds and the preemptions are steadier. "
    "Meridian's TTFO p99 is the batch class, served last inside its target. Throughput and goodput are "
    "aiperf's: divided by the time to the last answer. Medians over alternating rounds: `make bench-live` "
    "(docs/benchmarks/live-ab.md)."
)


def run_part(
    model: Path | None, cache_dir: Path, num_requests: int | None = None, rate_rps: float | None = None
) -> dict[str, Any]:
    """The demo part: one aiperf round against a stock server, one against Meridian, as one table.
    Without ``rate_rps`` the rate is ``OVERLOAD_FACTOR`` times the stock server's capacity measured
    first; without ``num_requests``, ``DEMO_SCHEDULE_S`` of arrivals at that rate."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    repo = Path.cwd()
    live_model = (
        LIVE_MODELS["tiny"] if model is None else dataclasses.replace(LIVE_MODELS["tiny"], folder=str(model.resolve()))
    )
    if not (live_model.path(repo) / "model.safetensors").exists():
        raise FileNotFoundError(
            f"no model weights in {live_model.path(repo)} (run from the repository root, or pass --model)"
        )
    settings = RoundSettings(
        model=live_model,
        repo=repo,
        cache_dir=cache_dir,
        aiperf=find_aiperf(repo),
        pin=len(os.sched_getaffinity(0)) >= 2,
    )
    out = cache_dir / "live"
    out.mkdir(parents=True, exist_ok=True)
    console = Console()
    capacity_rps = None
    if rate_rps is None:
        with console.status(
            "Calibrating: a burst of requests against a stock server measures what this machine serves"
        ):
            capacity_rps = measure_capacity_rps(STOCK.name, out, settings)
        rate_rps = round(OVERLOAD_FACTOR * capacity_rps, 1)
        console.print(
            f"Stock vLLM completed {capacity_rps:.1f} requests/s under a burst on this machine; the live "
            f"part sends {rate_rps:g}/s, {OVERLOAD_FACTOR:g}x that (past the knee; --live-rate sets it)."
        )
    num_requests = num_requests or max(1, round(DEMO_SCHEDULE_S * rate_rps))
    workload = Workload(num_requests, rate_rps, live_model.classes)
    dataset = out / "workload.jsonl"
    dataset.write_text(workload.jsonl())
    schedule_s = workload.entries()[-1]["timestamp"] / 1000.0
    console.print(
        f"\nLive: vLLM's OpenAI server (CPU build) serving the tiny reasoning model; aiperf replays {num_requests} "
        f"streaming requests (Poisson, {rate_rps:g}/s; interactive / standard / batch) open-loop, one round per "
        f"scheduler, engine core pinned to its own CPU: {settings.pin}. Full benchmark: `make bench-live`."
    )
    rows: dict[str, dict[str, Any]] = {}
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        for policy in (STOCK.name, MERIDIAN.name):
            task = progress.add_task(f"{policy}: starting", total=schedule_s + 10.0)

            def on_phase(phase: str, t: Any = task, p: str = policy) -> None:
                progress.update(t, description=f"{p}: {phase}")

            def on_tick(elapsed_s: float, t: Any = task) -> None:
                progress.update(t, completed=elapsed_s)

            row, _ = run_round(
                policy,
                policy,
                dataset,
                out,
                settings,
                on_phase=on_phase,
                on_tick=on_tick,
            )
            progress.update(task, description=f"{policy}: done", completed=schedule_s + 10.0)
            rows[policy] = table_row(row)
    # The labels' units are in brackets, which rich would take for markup.
    console.print(render(rows), markup=False, highlight=False)
    console.print(ONE_ROUND_CAVEAT, markup=False, highlight=False)
    return {
        "workload": {"num_requests": num_requests, "rate_rps": rate_rps, "capacity_rps": capacity_rps},
        "results": rows,
    }


def table_row(row: dict[str, Any]) -> dict[str, Any]:
    """The demo's figures of one round (``meridian.demo.loadgen.run_round``'s row)."""
    by_phase = row.get("preemptions_by_phase") or {}
    probe = row.get("speed_probe_ms") or {}
    return {
        **{key: row.get(key) for key, _, _ in ROWS},
        "interactive_good": row["per_class"]["interactive"]["good"],
        "failed": row["errors"] + row["failed_in_records"] + row["empty_responses"],
        "shed": row.get("shed", 0),
        "preemptions_answer": by_phase.get("answer"),
        "speed_probe": f"{probe['before']:.0f} / {probe['after']:.0f}" if probe else None,
    }


def render(rows: dict[str, dict[str, Any]]) -> str:
    """The side-by-side table."""

    def fmt(v: Any, spec: str) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        return spec.format(v)

    width = max(len(label) for _, label, _ in ROWS) + 2
    lines = [f"{'metric':<{width}}{'stock vLLM':>14}{'Meridian':>14}", "-" * (width + 28)]
    stock, ours = rows[STOCK.name], rows[MERIDIAN.name]
    lines += [
        f"{label:<{width}}{fmt(stock.get(key), spec):>14}{fmt(ours.get(key), spec):>14}" for key, label, spec in ROWS
    ]
    return "\n".join(lines)
