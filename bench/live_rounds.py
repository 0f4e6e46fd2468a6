"""Issue 48, item 1: why one live overload workload gives Meridian very different rounds. For each
Meridian round of a ``bench/live_overload.py`` folder (one placement's), beside the same round's
other arms:

- what it shed: refused at arrival by the gate (a notice within the request's own handling) and
  shed in the engine (later), from aiperf's records;
- its engine's steps, from the round's step log: the mean step, how far the step-time model's
  prediction (made before each step was measured) was off (``measured / predicted``: median, 10th
  and 90th percentile, share of steps off by more than 1.5×), and the decode step the plans judged
  deadlines with against the decode steps the engine then took;
- how aiperf sent: the lag of each send behind its schedule (aiperf's ``request_start_ns`` less
  its ``credit_issued_ns``) and the most requests sent within one second, beside the schedule's;
- the counterfactual: the round's arrivals replayed on a profile and a step-time noise fitted to
  that round's own step log, once with Meridian's defaults and once with every class queued
  instead of shed (``on_overload: queue``); of the requests Meridian shed live, how many met every
  target in the queued replay (they would have met them had they been admitted, as far as the
  replay of that round's engine can tell), and how many the queued replay meets in all. Twice:
  at the workload's scheduled times and at the times aiperf really sent (``sent``), which is what
  the live engine met — a stalled load generator releases its backlog as one burst.

    .venv/bin/python bench/live_rounds.py FOLDER [--load 1.5] [--noise-seeds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from meridian.demo.loadgen import LIVE_MODELS, live_profile, read_packed_records, workload_trace
from meridian.offline.engine import offline_environment
from meridian.replay.policies import policy_spec, replay_policy
from meridian.replay.profiles import fit_profile, step_noise_of_log
from meridian.replay.report import is_shed
from meridian.replay.workload import model_dir_for, offline_requests

REPO = Path(__file__).resolve().parent.parent


def step_rows(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def step_stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The engine's steps and the model's error on them (lines without a prediction: older logs)."""
    steps = np.array([r["step_ms"] for r in rows])
    out: dict[str, Any] = {"steps": len(rows), "step_ms_mean": float(steps.mean()) if len(steps) else None}
    ratio = np.array([r["step_ms"] / r["predicted_ms"] for r in rows if r.get("predicted_ms")])
    if len(ratio):
        out.update(
            model_ratio_p10=float(np.percentile(ratio, 10)),
            model_ratio_p50=float(np.median(ratio)),
            model_ratio_p90=float(np.percentile(ratio, 90)),
            off_by_1_5x=float(np.mean((ratio > 1.5) | (ratio < 1 / 1.5))),
        )
    decode = [
        (r["decode_step_ms"], r["step_ms"])
        for r in rows
        if r.get("decode_step_ms") and r["num_prefill_tokens"] == 0 and r["num_decode_requests"] > 0
    ]
    if decode:
        planned, real = np.array(decode).T
        out.update(
            decode_planned_ms=float(np.median(planned)),
            decode_real_ms=float(np.median(real)),
            decode_real_over_planned_mean=float(real.mean() / planned.mean()),
        )
    out["num_shed_in_steps"] = int(sum(r.get("num_shed", 0) for r in rows))
    return out


def send_times_ms(folder: Path, name: str) -> dict[int, float]:
    """Per session (the workload's line), when aiperf sent it, ms after its first credit."""
    with gzip.open(folder / f"aiperf-{name}" / "profile_export.jsonl.gz", "rt") as f:
        meta = [json.loads(line)["metadata"] for line in f if line.strip()]
    first_ns = min(m["credit_issued_ns"] for m in meta)
    return {m["session_num"]: (m["request_start_ns"] - first_ns) / 1e6 for m in meta}


def most_in_one_second(times_ms: list[float]) -> int:
    times = np.sort(np.asarray(times_ms))
    return int((np.searchsorted(times, times + 1_000.0) - np.arange(len(times))).max()) if len(times) else 0


def send_stats(folder: Path, name: str, trace: list[Any]) -> dict[str, Any]:
    """How far aiperf's sends fell behind the schedule, and how bunched they came."""
    sent = send_times_ms(folder, name)
    start_ms = trace[0].arrival_ms
    lag = np.array([sent[i] - (t.arrival_ms - start_ms) for i, t in enumerate(trace) if i in sent])
    return {
        "lag_ms_p50": float(np.median(lag)),
        "lag_ms_p99": float(np.percentile(lag, 99)),
        "lag_ms_max": float(lag.max()),
        "most_in_1s_sent": most_in_one_second(list(sent.values())),
        "most_in_1s_scheduled": most_in_one_second([t.arrival_ms for t in trace]),
    }


def as_sent(folder: Path, name: str, trace: list[Any]) -> list[Any]:
    """The workload's requests at the times aiperf really sent them (schedule's origin kept)."""
    sent = send_times_ms(folder, name)
    start_ms = trace[0].arrival_ms
    moved = [dataclasses.replace(t, arrival_ms=start_ms + sent[i]) for i, t in enumerate(trace) if i in sent]
    return sorted(moved, key=lambda t: t.arrival_ms)


def counterfactual(
    folder: Path, load: str, name: str, settings: dict[str, Any], shed_sessions: set[int], cache_dir: Path, seeds: int
) -> dict[str, Any]:
    """The round's arrivals (scheduled, and as aiperf sent them) on its own engine's fitted profile
    and noise: Meridian as configured and with every class queued; which of the live sheds met
    every target in the queued replay."""
    from meridian._core import Config

    model = LIVE_MODELS[settings["model"]]
    log = cache_dir / f"live-rounds-{name}.jsonl"
    with gzip.open(folder / f"steps-{name}.jsonl.gz", "rt") as src:
        log.write_text(src.read())
    profile = fit_profile(
        log, live_profile(settings["model"], settings.get("kv_cache_tokens") or model.kv_cache_tokens), name
    )
    noise = step_noise_of_log(log, profile)
    classes = model.meridian_classes()
    configs = {
        "meridian": {"classes": classes, "default_class": "standard"},
        "queued": {
            "classes": {c: {**v, "on_overload": "queue"} for c, v in classes.items()},
            "default_class": "standard",
        },
    }
    trace = workload_trace(folder / f"workload-{load}x.jsonl")
    out: dict[str, Any] = {"noise": noise.to_json(), "sends": send_stats(folder, name, trace)}
    for arrivals, requests_at in (("scheduled", trace), ("sent", as_sent(folder, name, trace))):
        requests = [
            dataclasses.replace(r, max_tokens=model.max_tokens)
            for r in offline_requests(requests_at, profile, Config.from_json(json.dumps(configs["meridian"])))
        ]
        out[arrivals] = {}
        for label, config in configs.items():
            goods, rescued, sheds = [], [], []
            for seed in range(seeds):
                result = replay_policy(
                    policy_spec("meridian"),
                    requests,
                    profile.with_noise(noise.with_seed(seed)),
                    meridian_config=config,
                    model_dir=model_dir_for(profile, cache_dir),
                    batch_queue_size=1,
                )
                timelines = result.run.timelines
                good = {
                    int(req_id[1:])
                    for req_id, t in timelines.items()
                    if t.report is not None and not is_shed(t) and t.report.reason == "stopped" and t.report.met_all
                }
                goods.append(len(good))
                rescued.append(len(good & shed_sessions))
                sheds.append(sum(is_shed(t) for t in timelines.values()))
            out[arrivals][label] = {
                "good": statistics.median(goods),
                "shed": statistics.median(sheds),
                "live_sheds_met": statistics.median(rescued),
            }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--load", default="1.5")
    parser.add_argument("--noise-seeds", type=int, default=3)
    parser.add_argument("--no-replay", action="store_true", help="only the live figures")
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".cache")
    args = parser.parse_args()
    result = json.loads((args.folder / "results.json").read_text())
    settings = result["settings"]
    model = LIVE_MODELS[settings["model"]]
    by_name = {c.name: c for c in model.classes}
    offline_environment(args.cache_dir)
    rounds: dict[int, dict[str, Any]] = {}
    for row in result["loads"][args.load]["rounds"]:
        rounds.setdefault(row["round"], {})[row["policy"]] = row
    out: dict[str, Any] = {}
    for k, arms in sorted(rounds.items()):
        name = f"{args.load}x-{k}-meridian"
        if "meridian" not in arms:
            continue
        recs = read_packed_records(args.folder, name)
        shed = [r for r in recs if r.shed]
        # The server's request log counts the engine's sheds; the rest were refused at arrival.
        notices = arms["meridian"].get("server_notices") or {}
        gate = len(shed) - sum(n["engine_sheds"] for n in notices.values())
        entry: dict[str, Any] = {
            "met": {arm: row["good_requests"] for arm, row in arms.items()},
            "shed": len(shed),
            "shed_at_arrival": gate,
            "shed_in_engine": len(shed) - gate,
            "shed_by_class": {c: sum(r.meridian_class == c for r in shed) for c in by_name},
            "speed_probe_ms": {arm: row.get("speed_probe_ms") for arm, row in arms.items()},
        }
        steps_path = args.folder / f"steps-{name}.jsonl.gz"
        if steps_path.exists():
            entry["steps"] = step_stats(step_rows(steps_path))
            if not args.no_replay:
                sessions = {r.session for r in shed if r.session is not None}
                entry["replay"] = counterfactual(
                    args.folder, args.load, name, settings, sessions, args.cache_dir, args.noise_seeds
                )
        out[str(k)] = entry
        print(f"round {k}: {json.dumps(entry, default=str)}", flush=True)
    (args.folder / f"rounds-{args.load}x.json").write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"wrote {args.folder / f'rounds-{args.load}x.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
