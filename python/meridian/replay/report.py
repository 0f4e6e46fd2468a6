"""Replay metrics and reports: the per-policy summary of docs/request-life.md §4, the terminal table, the JSON
file and the PNG plots.

It owns the reduction from per-request reports (the observer core's ledgers, one definition for
every policy) to the numbers an operator compares: latency percentiles, goodput against each
request's class targets, throughput, stalls and preemptions by phase, per class and overall.
Invariant: every number is computed from the same requests for every policy — a request that did
not complete counts as submitted and not good, never silently dropped. A shed request — ended
early by the scheduler's triage (its stop reason carries ``SHED_MARKER``) or refused at arrival
by an arrival gate such as vLLM's load valve (``Timeline.shed_by``, notice time 0) — is a missed
request, counted in ``shed`` (and by who shed it in ``shed_by``), never a failure.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meridian._core import SHED_MARKER, SHED_REASONS, parse_shed_notice
from meridian.offline.engine import Timeline
from meridian.replay.policies import ReplayResult

#: Latency fields summarised as ``{p50, p90, p99, mean}``.
LATENCY_FIELDS = ("ttft_ms", "ttfat_ms", "answer_tpot_ms", "think_tpot_ms")


def percentile_summary(values: Sequence[float]) -> dict[str, float | None]:
    """``{p50, p90, p99, mean}`` of ``values`` (``None`` each when empty)."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    arr = np.asarray(values, dtype=np.float64)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(arr.mean())}


def summarize(result: ReplayResult) -> dict[str, Any]:
    """The policy's metrics overall and per class (JSON-ready)."""
    run = result.run
    timelines = list(run.timelines.values())
    duration_s = max(run.clock_ms, 1e-9) / 1000.0
    summary = _summarize_group(timelines, duration_s)
    summary["per_class"] = {
        name: _summarize_group([t for t in timelines if t.slo_class == name], duration_s)
        for name in sorted({t.slo_class for t in timelines})
    }
    summary["first_minute"] = first_minute(timelines)
    if result.cache_aware_window is not None:
        summary["cache_aware_window"] = result.cache_aware_window
    summary.update(
        policy=result.policy,
        duration_s=duration_s,
        num_steps=run.num_steps,
        peak_in_flight=run.peak_in_flight,
        queue_cap=result.queue_cap,
        device_utilization=run.device_busy_ms / max(run.clock_ms, 1e-9),
        answer_preemption_alarms=run.num_answer_preemption_alarms,
        kv_tier={
            "loads": run.num_tier_loads,
            "loaded_tokens": run.num_tier_loaded_tokens,
            "restored_resumes": run.num_restored_resumes,
            "restore_plans": run.restore_counters,
            "stored_preemptions": run.num_stored_preemptions,
            "stored_restored_resumes": run.num_stored_restored_resumes,
            "resumes": run.num_resumes,
            "resumed_tokens": run.resumed_tokens,
            "resumed_device_hit_tokens": run.resumed_device_hit_tokens,
            "resumed_tier_hit_tokens": run.resumed_tier_hit_tokens,
        },
        prefix_cache={
            "queries": run.prefix_cache_queries,
            "hits": run.prefix_cache_hits,
            "hit_rate": run.prefix_cache_hits / run.prefix_cache_queries if run.prefix_cache_queries else None,
        },
    )
    return summary


#: The cohort ``first_minute`` reports: requests arriving this soon after the first arrival.
FIRST_MINUTE_MS = 60_000.0


def first_minute(timelines: Sequence[Timeline]) -> dict[str, Any]:
    """How the requests that arrived in the first minute fared: the cohort served while a
    length predictor still holds little more than its prior (the same requests for every
    policy, so their counts compare directly)."""
    if not timelines:
        return {"submitted": 0, "good": 0, "attainment": None}
    start_ms = min(t.arrival_ms for t in timelines)
    cohort = [t for t in timelines if t.arrival_ms < start_ms + FIRST_MINUTE_MS]
    good = sum(1 for t in cohort if t.report is not None and t.report.reason == "stopped" and t.report.met_all)
    return {"submitted": len(cohort), "good": good, "attainment": good / len(cohort)}


#: ``shed_by`` key of the requests the scheduler itself shed (Meridian's triage).
SHED_BY_SCHEDULER = "scheduler"


def is_shed(t: Timeline) -> bool:
    """Whether the request was shed: ended early by the scheduler's triage (its stop reason says
    so) or refused at arrival by an arrival gate (vLLM's load valve, say)."""
    return t.shed_by is not None or (t.stop_reason is not None and t.stop_reason.startswith(SHED_MARKER))


def shed_by(t: Timeline) -> str | None:
    """Who shed the request: the arrival gate's reason (e.g. ``valve``), ``SHED_BY_SCHEDULER`` for
    the scheduler's triage, ``None`` when it was not shed."""
    if t.shed_by is not None:
        return t.shed_by
    return SHED_BY_SCHEDULER if is_shed(t) else None


def shed_reason(t: Timeline) -> str | None:
    """The target a shed request was shed for, read off its notice (the replay's own ledger,
    the same for every policy, does not know the core's triage)."""
    notice = parse_shed_notice(t.stop_reason) if t.stop_reason is not None else None
    return notice[0] if notice is not None else None


def _summarize_group(timelines: Sequence[Timeline], duration_s: float) -> dict[str, Any]:
    reports = [t.report for t in timelines if t.report is not None]
    shed = [t for t in timelines if is_shed(t) and t.report is not None and t.report.e2e_ms is not None]
    completed = [r for r in reports if r.reason == "stopped"]
    good = sum(1 for r in completed if r.met_all)
    num_tokens = sum(len(t.token_times_ms) for t in timelines)
    out: dict[str, Any] = {
        field: percentile_summary([v for r in completed if (v := getattr(r, field)) is not None])
        for field in LATENCY_FIELDS
    }
    out.update(
        submitted=len(timelines),
        completed=len(completed),
        good=good,
        attainment=good / len(timelines) if timelines else None,
        goodput_rps=good / duration_s,
        throughput_tok_s=num_tokens / duration_s,
        stalls=sum(r.num_stalls for r in reports),
        shed=sum(1 for t in timelines if is_shed(t)),
        # Of those, who shed them (arrival-gate refusals under their reason, e.g. "valve").
        shed_by=_count_by(shed_by(t) for t in timelines),
        refused=sum(1 for t in timelines if t.shed_by is not None),
        # How long a shed request's client waited to learn its fate (arrival to the abort).
        shed_notice_ms=percentile_summary([t.report.e2e_ms for t in shed if t.report and t.report.e2e_ms is not None]),
        # The same, by the target the request was shed for (a TTFAT shed is judged while the
        # request thinks, so its notice comes after the TTFT target but before the TTFAT one).
        shed_notice_ms_by_reason={
            reason: percentile_summary(
                [t.report.e2e_ms for t in shed if t.report and t.report.e2e_ms is not None and shed_reason(t) == reason]
            )
            for reason in SHED_REASONS
        },
        thinking_tokens=sum(r.num_think_tokens for r in reports),
        thinking_stops=sum(1 for t in timelines if t.thinking_stopped_by is not None),
        preemptions={
            "prefill": sum(r.num_preemptions_prefill for r in reports),
            "think": sum(r.num_preemptions_think for r in reports),
            "answer": sum(r.num_preemptions_answer for r in reports),
        },
    )
    return out


def _count_by(keys: Iterable[str | None]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key in keys:
        if key is not None:
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


@dataclass
class PolicyRun:
    """What a replay keeps of one policy's run: plain values (they cross process boundaries)."""

    policy: str
    rate_scale: float
    summary: dict[str, Any]
    ttfat_ms: list[float]
    answer_tpot_ms: list[float]


def policy_run(result: ReplayResult, rate_scale: float) -> PolicyRun:
    """Reduces a replay to its summary and the per-request values the CDF plots need."""
    reports = [r for r in result.run.reports if r.reason == "stopped"]
    summary = summarize(result)
    summary["rate_scale"] = rate_scale
    return PolicyRun(
        policy=result.policy,
        rate_scale=rate_scale,
        summary=summary,
        ttfat_ms=[r.ttfat_ms for r in reports if r.ttfat_ms is not None],
        answer_tpot_ms=[r.answer_tpot_ms for r in reports if r.answer_tpot_ms is not None],
    )


# ---- terminal ----------------------------------------------------------------------------------


def _fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value / scale:.{digits}f}"


def table(summaries: Sequence[dict[str, Any]], baseline: str | None = "vllm-fcfs") -> str:
    """One line per policy: goodput (and its ratio to ``baseline``), attainment, throughput,
    TTFAT p50/p99, answer TPOT p50/p99, stalls, preemptions by phase."""
    base = next((s for s in summaries if s["policy"] == baseline), None)
    header = (
        f"{'policy':<22} {'goodput/s':>9} {'×base':>6} {'attain':>6} {'tok/s':>8} {'×base':>6} "
        f"{'TTFAT p50':>9} {'p99 (s)':>8} {'ansTPOT p50':>11} {'p99 (ms)':>8} {'stalls':>6} {'preempt t/a':>11}"
    )
    lines = [header, "-" * len(header)]
    for s in summaries:
        goodput_ratio = s["goodput_rps"] / base["goodput_rps"] if base and base["goodput_rps"] > 0 else None
        tput_ratio = s["throughput_tok_s"] / base["throughput_tok_s"] if base and base["throughput_tok_s"] > 0 else None
        pre = s["preemptions"]
        lines.append(
            f"{s['policy']:<22} {s['goodput_rps']:>9.3f} {_fmt(goodput_ratio, digits=2):>6} "
            f"{_fmt(s['attainment'], 0.01, 0) + '%':>6} {s['throughput_tok_s']:>8.0f} {_fmt(tput_ratio, digits=3):>6} "
            f"{_fmt(s['ttfat_ms']['p50'], 1000):>9} {_fmt(s['ttfat_ms']['p99'], 1000):>8} "
            f"{_fmt(s['answer_tpot_ms']['p50']):>11} {_fmt(s['answer_tpot_ms']['p99']):>8} {s['stalls']:>6} "
            f"{str(pre['think']) + '/' + str(pre['answer']):>11}"
        )
    tiered = [s for s in summaries if s.get("kv_tier", {}).get("loads")]
    if tiered:
        lines.append(
            "host KV tier: "
            + ", ".join(
                f"{s['policy']} {s['kv_tier']['restored_resumes']} of {sum(s['preemptions'].values())} "
                f"preempted requests restored ({s['kv_tier']['loaded_tokens']:,} tokens loaded)"
                for s in tiered
            )
        )
    shed = [s for s in summaries if s.get("shed")]
    if shed:
        lines.append(
            "shed (ended early with a notice, counted as missed): "
            + ", ".join(
                f"{s['policy']} {s['shed']} of {s['submitted']} requests{_refusals(s)}, notice p50 "
                f"{_fmt((s.get('shed_notice_ms') or {}).get('p50'), 1000)} s"
                for s in shed
            )
        )
    stopped = [s for s in summaries if s.get("thinking_stops")]
    if stopped:
        lines.append(
            "thinking control ended reasoning early: "
            + ", ".join(
                f"{s['policy']} {s['thinking_stops']} requests ({s['thinking_tokens']:,} thinking tokens)"
                for s in stopped
            )
        )
    return "\n".join(lines)


def _refusals(s: dict[str, Any]) -> str:
    """`` (N refused at arrival by valve, cap C)`` for a policy whose arrival gate refused some."""
    gates = {k: v for k, v in (s.get("shed_by") or {}).items() if k != SHED_BY_SCHEDULER}
    if not gates:
        return ""
    cap = f", cap {s['queue_cap']}" if s.get("queue_cap") is not None else ""
    return " (" + ", ".join(f"{n} refused at arrival by {k}" for k, n in gates.items()) + cap + ")"


# ---- files -------------------------------------------------------------------------------------


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, ax: Any, path: Path, xlabel: str, ylabel: str) -> Path:
    """Labels, grid and legend, then the PNG; closes the figure."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def plot_cdfs(runs: Iterable[PolicyRun], out_dir: Path, suffix: str = "") -> list[Path]:
    """CDFs of TTFAT and answer TPOT per policy, one PNG each."""
    import numpy as np

    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = list(runs)
    written = []
    for name, unit, scale in (("ttfat", "s", 1000.0), ("answer_tpot", "ms", 1.0)):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for run in runs:
            values = np.sort(np.asarray(getattr(run, f"{name}_ms"), dtype=np.float64)) / scale
            if values.size:
                ax.step(values, np.arange(1, values.size + 1) / values.size, where="post", label=run.policy)
        ax.set_xscale("log")
        xlabel = f"{name.replace('_', ' ').upper()} ({unit})"
        written.append(_save(fig, ax, out_dir / f"cdf_{name}{suffix}.png", xlabel, "fraction of completed requests"))
    return written


def _goodput(s: dict[str, Any]) -> float:
    return float(s["goodput_rps"])


def _ttfat_p99_s(s: dict[str, Any]) -> float:
    p99 = s["ttfat_ms"]["p99"]
    return float("nan") if p99 is None else float(p99) / 1000.0


def plot_load_sweep(sweep: dict[float, list[dict[str, Any]]], out_dir: Path) -> list[Path]:
    """Goodput and TTFAT p99 against the rate scale, one line per policy."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    scales = sorted(sweep)
    policies = [s["policy"] for s in sweep[scales[0]]]
    written = []
    for name, read, label in (
        ("goodput_vs_load", _goodput, "goodput (requests/s meeting all targets)"),
        ("ttfat_p99_vs_load", _ttfat_p99_s, "TTFAT p99 (s)"),
    ):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for policy in policies:
            ys = [read(next(s for s in sweep[x] if s["policy"] == policy)) for x in scales]
            ax.plot(scales, ys, marker="o", label=policy)
        written.append(_save(fig, ax, out_dir / f"{name}.png", "arrival rate scale (× trace rate)", label))
    return written
