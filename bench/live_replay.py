"""The live overload runs replayed: the very workload of a ``bench/live_overload.py`` run through the
offline engine (vLLM's own schedulers, virtual time) on a profile of this CPU fitted to one of its
live Meridian rounds' step logs, every arm side by side, then compared with the live rounds class
by class and request by request — where the replay predicts what the server did not deliver, the
gap between them.

Each request replays as the live fixture answered it under greedy decoding: ``think N answer M``
thinks exactly N tokens, then ``</think>``, M letters and EOS (``tests/offline/test_tiny_model.py``
checks this through vLLM), with the live run's ``max_tokens`` (one value for every request) and
classes. The capacity is the live server's (KV blocks, seats, context); the step time is the
linear fit of the step log (base, per prompt token, per decoding request, per context token).
What the replay cannot see: the API server and the load generator (they share the other core
live), the engine's own overheads between steps beyond what the step log's step times hold, and
the machine's drift between rounds.

    .venv/bin/python bench/live_replay.py bench/results/live_overload_servegen_long_2026-12-06 [--load 1.5]
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

from meridian.demo.loadgen import LIVE_MODELS, ClassTargets, RecordTimes, is_good, live_profile, workload_trace
from meridian.offline.engine import offline_environment
from meridian.replay.policies import policy_spec, replay_policy
from meridian.replay.profiles import fit_profile
from meridian.replay.report import is_shed, summarize
from meridian.replay.workload import model_dir_for, offline_requests

REPO = Path(__file__).resolve().parent.parent
#: Live arm → the replay's policy name (the valve's cap is the live run's).
REPLAY_POLICY = {"stock": "vllm-fcfs", "fcfs+cap": "vllm-fcfs+cap={cap}", "priority+cap": "vllm-priority+cap={cap}",
                 "priority": "vllm-priority", "meridian": "meridian"}


def live_records(folder: Path, name: str) -> list[RecordTimes]:
    with gzip.open(folder / f"records-{name}.jsonl.gz", "rt") as f:
        return [RecordTimes(**json.loads(line)) for line in f]


def replay_outcomes(result: Any, classes: dict[str, ClassTargets]) -> dict[int, bool]:
    """Request k → whether it met every target of its class in the replay."""
    out = {}
    for req_id, t in result.run.timelines.items():
        r = t.report
        good = (r is not None and not is_shed(t) and r.reason == "stopped" and r.met_all)
        out[int(req_id[1:])] = bool(good)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a bench/live_overload.py results folder")
    parser.add_argument("--load", default=None, help="the load to replay (default: every load of the run)")
    parser.add_argument("--fit-round", default=None, help="the Meridian round whose step log fits the profile")
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".cache")
    parser.add_argument("--variant", type=lambda t: (t.partition("=")[0], json.loads(t.partition("=")[2])),
                        action="append", default=[], help="NAME=JSON: also replay Meridian with this config variant")
    parser.add_argument("--step-log", type=Path, default=None,
                        help="fit the profile to this step log instead of the run's own Meridian round")
    args = parser.parse_args()
    results = json.loads((args.folder / "results.json").read_text())
    settings = results["settings"]
    model = LIVE_MODELS[settings["model"]]
    kv_tokens = settings.get("kv_cache_tokens") or model.kv_cache_tokens
    classes = {c.name: c for c in model.classes}
    offline_environment(args.cache_dir)
    out: dict[str, Any] = {}
    loads = [args.load] if args.load else list(results["loads"])
    for load in loads:
        rows = results["loads"][load]["rounds"]
        meridian_rounds = [r for r in rows if r["policy"] == "meridian"]
        fit_name = args.fit_round or f"{load}x-{meridian_rounds[0]['round']}-meridian"
        step_log = args.step_log or args.folder / f"steps-{fit_name}.jsonl"
        if not step_log.exists():
            with gzip.open(f"{step_log}.gz", "rt") as src:
                step_log = args.cache_dir / f"live-replay-{fit_name}.jsonl"
                step_log.write_text(src.read())
        profile = fit_profile(step_log, live_profile(settings["model"], kv_tokens), f"live-{fit_name}")
        print(f"load {load}x: profile {profile.name}: {profile.sources['fit']}", flush=True)
        traces = workload_trace(args.folder / f"workload-{load}x.jsonl")
        meridian_config = {"classes": model.meridian_classes(), "default_class": "standard"}
        from meridian._core import Config

        # The live run's max_tokens, one value for every request.
        requests = [dataclasses.replace(r, max_tokens=model.max_tokens)
                    for r in offline_requests(traces, profile, Config.from_json(json.dumps(meridian_config)))]
        load_out: dict[str, Any] = {}
        variants = dict(args.variant)
        arms = sorted({r["policy"] for r in rows}) + [f"meridian:{v}" for v in variants]
        for arm in dict.fromkeys(arms):
            base, _, variant = arm.partition(":")
            base, _, explicit_cap = base.partition("=")
            policy = REPLAY_POLICY.get(base)
            if policy is None or (variant and variant not in variants):
                continue
            spec = policy_spec(policy.format(cap=explicit_cap or results["cap"]))
            config = {**meridian_config, **variants.get(variant, {})}
            # vLLM's CPU build schedules synchronously (it turns async scheduling off): one step
            # in flight, as live.
            result = replay_policy(spec, requests, profile, meridian_config=config,
                                   model_dir=model_dir_for(profile, args.cache_dir), batch_queue_size=1)
            summary = summarize(result)
            replayed = replay_outcomes(result, classes)
            live_rounds = [r for r in rows if r["policy"] == arm]
            if not live_rounds:  # a variant replayed only
                print(f"  {arm:13s} replay {summary['good']:4d}  (no live rounds)  shed {summary['shed']}  per class "
                      f"{ {c: summary['per_class'].get(c, {}).get('good', 0) for c in classes} }", flush=True)
                load_out[arm] = {"replay_good": summary["good"], "replay_shed": summary["shed"],
                                 "per_class_replay": {c: summary["per_class"].get(c, {}).get("good", 0) for c in classes}}
                continue
            per_class_live = {c: statistics.median(r["per_class"][c]["good"] for r in live_rounds) for c in classes}
            per_class_replay = {c: summary["per_class"].get(c, {}).get("good", 0) for c in classes}
            # Request by request: how often the replay's verdict agrees with each live round's.
            agreement = []
            for r in live_rounds:
                records = live_records(args.folder, f"{load}x-{r['round']}-{arm}")
                verdicts = {rec.session: is_good(rec, classes[rec.meridian_class]) for rec in records
                            if rec.session is not None and rec.meridian_class in classes}
                same = sum(verdicts[k] == replayed.get(k) for k in verdicts)
                agreement.append(same / len(verdicts) if verdicts else None)
            live_good = statistics.median(r["good_requests"] for r in live_rounds)
            load_out[arm] = {
                "replay_good": summary["good"], "live_good_median": live_good,
                "live_good_range": [min(r["good_requests"] for r in live_rounds), max(r["good_requests"] for r in live_rounds)],
                "replay_over_live": summary["good"] / live_good if live_good else None,
                "per_class_replay": per_class_replay, "per_class_live_median": per_class_live,
                "replay_shed": summary["shed"], "live_shed_median": statistics.median(r["shed"] for r in live_rounds),
                "request_agreement": agreement,
            }
            a = load_out[arm]
            print(f"  {arm:13s} replay {a['replay_good']:4d}  live {live_good:g} [{a['live_good_range'][0]}-"
                  f"{a['live_good_range'][1]}]  replay/live {a['replay_over_live'] or 0:.2f}  shed {a['replay_shed']} vs "
                  f"{a['live_shed_median']:g}  per class replay {per_class_replay} live {per_class_live}  agreement "
                  + "/".join(f"{x:.0%}" for x in agreement if x is not None), flush=True)
        out[load] = {"profile": profile.to_json() if hasattr(profile, "to_json") else profile.name, "arms": load_out}
    (args.folder / "replay.json").write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"wrote {args.folder / 'replay.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
