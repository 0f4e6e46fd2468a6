"""Issue 48: does step-time noise move Meridian's overload decisions? A live overload run's very
workload (``bench/live_overload.py`` folder, one load) replayed on the profile fitted to one of its
Meridian rounds' step logs, every arm side by side, first noiseless, then with step-time noise
(``meridian.replay.noise``) under several seeds, one seed a "round" (every arm of a round meets the
same noise, step for step). The noise is the round's own (fitted to the same step log) unless a
model is given, optionally scaled (``--sigma-scales``: the body's sigma and the spikes' share
multiplied, the spikes' size kept). Besides the live arms: ``meridian[fixed-model]``, Meridian
with its step-time model's online fit off (seeded with the profile's true cost), which tells
decisions spoiled by learning from noisy steps from decisions spoiled by the noise itself.

    .venv/bin/python bench/replay_noise.py bench/results/live_overload_servegen_long_2026-12-06 --load 1.5 \\
        --seeds 5 --sigma-scales 1,2,3 --out bench/results/replay_noise_DATE
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from meridian.demo.loadgen import LIVE_MODELS, live_profile, workload_trace
from meridian.offline.engine import offline_environment
from meridian.replay.noise import StepNoise
from meridian.replay.policies import meridian_seed_step_time, policy_spec, replay_policy
from meridian.replay.profiles import Profile, fit_profile, step_noise_of_log
from meridian.replay.report import summarize
from meridian.replay.workload import model_dir_for, offline_requests

REPO = Path(__file__).resolve().parent.parent
ARMS = {"stock": "vllm-fcfs", "fcfs+cap": "vllm-fcfs+cap={cap}", "meridian": "meridian", "meridian[fixed-model]": "meridian"}


def scaled(noise: StepNoise, scale: float) -> StepNoise:
    return dataclasses.replace(
        noise, sigma=noise.sigma * scale, spike_probability=min(noise.spike_probability * scale, 0.5)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--load", default="1.5")
    parser.add_argument("--fit-round", default=None, help="the Meridian round whose step log fits profile and noise")
    parser.add_argument("--noise", type=Path, default=None, help="a noise model instead of the fitted one")
    parser.add_argument("--sigma-scales", default="1", help="comma-separated multipliers of the noise (default 1)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".cache")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = time.monotonic()
    results = json.loads((args.folder / "results.json").read_text())
    settings = results["settings"]
    model = LIVE_MODELS[settings["model"]]
    kv_tokens = settings.get("kv_cache_tokens") or model.kv_cache_tokens
    offline_environment(args.cache_dir)
    rows = results["loads"][args.load]["rounds"]
    fit_name = args.fit_round or f"{args.load}x-{next(r['round'] for r in rows if r['policy'] == 'meridian')}-meridian"
    step_log = args.cache_dir / f"replay-noise-{fit_name}.jsonl"
    with gzip.open(args.folder / f"steps-{fit_name}.jsonl.gz", "rt") as src:
        step_log.write_text(src.read())
    profile = fit_profile(step_log, live_profile(settings["model"], kv_tokens), f"live-{fit_name}")
    noise = StepNoise.load(args.noise) if args.noise else step_noise_of_log(step_log, profile)
    print(f"profile {profile.name}: {profile.sources['fit']}\nnoise: {noise.to_json()}", flush=True)
    meridian_config = {"classes": model.meridian_classes(), "default_class": "standard"}
    from meridian._core import Config

    traces = workload_trace(args.folder / f"workload-{args.load}x.jsonl")
    requests = [dataclasses.replace(r, max_tokens=model.max_tokens)
                for r in offline_requests(traces, profile, Config.from_json(json.dumps(meridian_config)))]
    fixed = {"step_time": {**meridian_seed_step_time(profile), "online_fit": False}}

    def replay(arm: str, with_profile: Profile) -> dict[str, Any]:
        spec = policy_spec(ARMS[arm].format(cap=results["cap"]))
        config = {**meridian_config, **(fixed if arm.endswith("[fixed-model]") else {})}
        result = replay_policy(spec, requests, with_profile, meridian_config=config,
                               model_dir=model_dir_for(with_profile, args.cache_dir), batch_queue_size=1)
        s = summarize(result)
        return {"good": s["good"], "shed": s["shed"], "refused": s.get("refused", 0),
                "per_class": {c: s["per_class"][c]["good"] for c in s["per_class"]}}

    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    out: dict[str, Any] = {"folder": str(args.folder), "load": args.load, "fit_round": fit_name,
                           "profile": profile.to_json(), "noise": noise.to_json(), "noiseless": {}, "noisy": {}}
    for arm in arms:
        out["noiseless"][arm] = replay(arm, profile)
        print(f"noiseless {arm:22s} {out['noiseless'][arm]}", flush=True)
    for scale in [float(x) for x in args.sigma_scales.split(",")]:
        rounds: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
        for seed in range(args.seeds):
            noisy = profile.with_noise(scaled(noise, scale).with_seed(seed))
            for arm in arms:
                rounds[arm].append(replay(arm, noisy))
            print(f"x{scale:g} seed {seed}: " + "  ".join(f"{a} {rounds[a][-1]['good']}/{rounds[a][-1]['shed']}"
                                                       for a in arms), flush=True)
        out["noisy"][f"{scale:g}"] = rounds
    print(render(out))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"replay_noise_{args.load}x.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out} ({time.monotonic() - started:.0f} s)")
    return 0


def render(out: dict[str, Any]) -> str:
    """Per noise scale: each arm's requests meeting every target per seed, median, worst; Meridian
    over each other arm per seed (the same noise) and at its worst."""
    lines = ["| noise | arm | met, per seed | median | worst | sheds, median | Meridian / arm, worst seed |",
             "|---|---|---|---|---|---|---|"]
    for arm, r in out["noiseless"].items():
        ratio = out["noiseless"]["meridian"]["good"] / r["good"] if r["good"] and "meridian" in out["noiseless"] else 0
        lines.append(f"| none | {arm} | {r['good']} | {r['good']} | {r['good']} | {r['shed']} | {ratio:.2f} |")
    for scale, rounds in out["noisy"].items():
        for arm, rs in rounds.items():
            goods = [r["good"] for r in rs]
            worst_ratio = min((m["good"] / r["good"] for m, r in zip(rounds.get("meridian", []), rs) if r["good"]),
                              default=0.0)
            lines.append(f"| ×{scale} | {arm} | {', '.join(map(str, goods))} | {statistics.median(goods):g} | "
                         f"{min(goods)} | {statistics.median(r['shed'] for r in rs):g} | {worst_ratio:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
