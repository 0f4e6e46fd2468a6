"""vLLM 0.34's cache-aware admission (``--cache-aware-admission-window`` / ``-threshold``) in the
replay: how the stock baseline moves with its window on workloads with real prefix sharing, and
how it composes with Meridian.

``sweep`` — stock FCFS with the window off, docs-sized (``vllm-fcfs+cache-aware``: the queue that
drains within the tightest TTFT target, as the docs-sized valve plans it), and at each of
``--windows`` (threshold 0.5, vLLM's default, and ``--thresholds``), beside Meridian's default, on
the workloads that share prefixes:

- ``mooncake``: ``bench/replay_ab.py``'s window of the Mooncake trace (real block-hash reuse
  between requests; from 120 s, 150 s), 8B profile;
- ``mooncake0``: the same trace from its start (270 s): the conversations' earlier turns are in
  the window, so more of the reuse can hit;
- ``multiturn``: ``bench/replay_prefix_cache.py``'s multi-turn reasoning chat (conversations at the
  Azure conversation trace's arrivals, each later prompt the previous prompt and answer plus a new
  message; 32B profile): half of its prompt tokens hit the cache under FCFS.

Loads: ``--load-factors`` times each workload's FCFS-50 % load (``bench/development.HALF_LOAD``;
the multi-turn chat's is its share of conversation starts). Replays on whatever vLLM is imported:
0.32's CPU build runs the port (``meridian.replay.cache_aware``).

``compose`` — on vLLM 0.34 (run with ``PYTHONPATH=python:.vllm-0.34 VLLM_TARGET_DEVICE=cpu``: this
script then calls ``tests/triton_let_through.install()``, which lets 0.34's x86 triton-cpu check
through for the config build, nothing else), Meridian's scheduler with vLLM's own reorder running
inside ``super().schedule()`` on the order Meridian's plan gave ``waiting``: Meridian with its prefix
affinity off and on, each without and with vLLM's window (the docs-sized one and
``--compose-windows``), beside stock FCFS and FCFS with the window on the same vLLM.
``MeridianScheduler`` refuses the two ``SchedulerConfig`` fields at start-up, so the window is set
on the scheduler right after its ``__init__``, as vLLM's ``__init__`` sets it from the fields
(``cache_aware_scheduler(..., mode="after-init")``; the test shows it equal to the fields on stock
FCFS): what the flags would do under Meridian if let through.

Every replay is deterministic in virtual time: the numbers do not depend on this machine.

    .venv/bin/python bench/replay_cache_aware.py sweep [--workloads mooncake mooncake0 multiturn]
        [--load-factors 1 2] [--windows 2,4,8,16,32,64,128,256,1024] [--json PATH]
    PYTHONPATH=python:.vllm-0.34 VLLM_TARGET_DEVICE=cpu .venv/bin/python bench/replay_cache_aware.py compose
        [--workloads ...] [--load-factors 1 2] [--json PATH]
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

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from development import HALF_LOAD, REPO, workloads, write_results  # noqa: E402
from meridian._core import Config  # noqa: E402
from meridian.replay import traces  # noqa: E402
from meridian.replay.policies import (  # noqa: E402
    CACHE_AWARE,
    ReplayResult,
    cache_aware_window_for,
    policy_spec,
    replay_engine,
    shared_first_blocks,
)
from meridian.replay.profiles import Profile  # noqa: E402
from meridian.replay.report import policy_run  # noqa: E402
from meridian.replay.runner import ReplayOptions, build_workload  # noqa: E402
from meridian.replay.workload import model_dir_for, offline_requests  # noqa: E402
from replay_prefix_cache import MULTITURN_HALF_LOAD, multiturn_options  # noqa: E402

WORKLOADS = ("mooncake", "mooncake0", "multiturn")
#: The Mooncake trace from its start: bench/replay_prefix_cache.py's ``--start-s 0 --duration-s 270``.
MOONCAKE_FROM_START = (0.0, 270.0)


def workload_options(name: str, factor: float, scratch: Path) -> tuple[ReplayOptions, float]:
    """The workload's replay options and rate scale at ``factor`` × its FCFS-50 % load."""
    if name == "multiturn":  # the load is the share of conversation starts; time is not stretched
        share = MULTITURN_HALF_LOAD * factor
        return multiturn_options(scratch / f"multiturn-{factor:g}.jsonl", share), 1.0
    options = workloads(0)["mooncake"].options
    if name == "mooncake0":
        options = replace(options, start_s=MOONCAKE_FROM_START[0], duration_s=MOONCAKE_FROM_START[1])
    elif name != "mooncake":
        raise SystemExit(f"unknown workload {name!r}: expected one of {', '.join(WORKLOADS)}")
    return options, HALF_LOAD["mooncake"] * factor


def prepared(options: ReplayOptions, scale: float) -> tuple[list[Any], Profile, dict[str, Any]]:
    profile = Profile.load(options.profile)
    requests, _ = build_workload(options)
    config = options.meridian_config
    offline = offline_requests(traces.scale_rate(requests, scale), profile, Config.from_json(json.dumps(config)))
    return offline, profile, config


def replay(
    label: str,
    policy: str,
    offline: list[Any],
    profile: Profile,
    config: dict[str, Any],
    scale: float,
    scheduler_cls: type[Any] | None = None,
    window: int | None = None,
) -> dict[str, Any]:
    """One replay's summary, labelled; ``scheduler_cls`` in place of the policy's own."""
    started = time.monotonic()
    spec = policy_spec(policy)
    engine = replay_engine(
        spec, offline, profile, meridian_config=config, model_dir=model_dir_for(profile, REPO / ".cache"),
        scheduler_cls=scheduler_cls,
    )
    run = engine.run()
    summary = policy_run(ReplayResult(label, run, cache_aware_window=window), scale).summary
    summary["wall_s"] = time.monotonic() - started
    return summary


def slim(summary: dict[str, Any]) -> dict[str, Any]:
    """What the results file keeps of a summary (the full one runs to tens of kB per replay)."""

    def group(s: dict[str, Any]) -> dict[str, Any]:
        return {
            "submitted": s["submitted"], "good": s["good"], "attainment": s["attainment"],
            "ttft_ms": {k: s["ttft_ms"][k] for k in ("p50", "p99")},
            "ttfat_ms": {k: s["ttfat_ms"][k] for k in ("p50", "p99")},
        }

    keep = ("goodput_rps", "throughput_tok_s", "stalls", "preemptions", "prefix_cache", "cache_aware_window",
            "shed", "duration_s", "wall_s")
    return {"policy": summary["policy"], **group(summary), **{k: summary[k] for k in keep if k in summary},
            "per_class": {name: group(c) for name, c in summary["per_class"].items()}}


def line(s: dict[str, Any], base: dict[str, Any]) -> str:
    hit = (s["prefix_cache"]["hit_rate"] or 0.0) * 100
    ratio = s["good"] / base["good"] if base["good"] else float("nan")
    tails = "  ".join(
        f"{c[:5]} {v['ttft_ms']['p99'] / 1e3:6.1f}/{v['ttfat_ms']['p99'] / 1e3:5.0f}" for c, v in s["per_class"].items()
    )
    return (f"{s['policy']:<40} {s['good']:>5} {ratio:>6.3f} {hit:>6.1f}% {s['throughput_tok_s']:>7.0f} "
            f"{s['throughput_tok_s'] / base['throughput_tok_s']:>6.3f}  {tails}  ({s['wall_s']:.0f} s)")


HEADER = (f"{'policy':<40} {'good':>5} {'×fcfs':>6} {'hit':>7} {'tok/s':>7} {'×fcfs':>6}  "
          "class TTFT p99 / TTFAT p99 (s)")


def sweep(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in args.workloads:
        for factor in args.load_factors:
            options, scale = workload_options(name, factor, scratch)
            offline, profile, config = prepared(options, scale)
            docs = cache_aware_window_for(policy_spec(CACHE_AWARE), offline, profile, config)
            sharing = shared_first_blocks(offline, profile.block_size)
            print(f"\n=== {name} ×{factor:g} (rate scale {scale:.4g}), {len(offline)} requests, profile {profile.name}: "
                  f"{sharing} share their first KV block with another; docs-sized window {docs}", flush=True)
            print(HEADER, flush=True)
            rows: dict[str, dict[str, Any]] = {}
            policies = ["vllm-fcfs", CACHE_AWARE]
            policies += [f"{CACHE_AWARE}={w}" for w in args.windows]
            policies += [f"{CACHE_AWARE}={w}:{t:g}" for t in args.thresholds for w in (docs, *args.windows)]
            policies += ["meridian"]
            for policy in dict.fromkeys(policies):
                window = cache_aware_window_for(policy_spec(policy), offline, profile, config)
                rows[policy] = replay(policy, policy, offline, profile, config, scale, window=window)
                print(line(rows[policy], rows["vllm-fcfs"]), flush=True)
            out[f"{name} x{factor:g}"] = {"workload": name, "load_factor": factor, "rate_scale": scale,
                                          "requests": len(offline), "shared_first_block": sharing,
                                          "docs_sized_window": docs, "rows": {k: slim(v) for k, v in rows.items()}}
    return out


def compose(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    import vllm

    sys.path.insert(0, str(REPO / "tests"))
    import triton_let_through  # test-only: lets 0.34's x86 triton-cpu check through for the config build

    triton_let_through.install()
    from meridian.replay.cache_aware import NATIVE, cache_aware_scheduler
    from meridian.vllm.scheduler import MeridianScheduler

    if not NATIVE:
        raise SystemExit(f"compose runs vLLM's own cache-aware admission: vLLM {vllm.__version__} has none (0.34+)")
    no_affinity = {"prefix_affinity": {"enabled": False}}
    out: dict[str, Any] = {"vllm": vllm.__version__}
    for name in args.workloads:
        for factor in args.load_factors:
            options, scale = workload_options(name, factor, scratch)
            offline, profile, config = prepared(options, scale)
            docs = cache_aware_window_for(policy_spec(CACHE_AWARE), offline, profile, config)
            windows = list(dict.fromkeys([docs, *args.compose_windows]))
            print(f"\n=== {name} ×{factor:g} on vLLM {vllm.__version__}, {len(offline)} requests: docs-sized window {docs}",
                  flush=True)
            print(HEADER, flush=True)
            arms: list[tuple[str, str, dict[str, Any], type[Any] | None, int | None]] = [
                ("vllm-fcfs", "vllm-fcfs", config, None, None),
                *((f"{CACHE_AWARE}={w}", f"{CACHE_AWARE}={w}", config, None, w) for w in windows),
            ]
            for affinity, cfg in (("off", {**config, **no_affinity}), ("on", config)):
                arms.append((f"meridian, affinity {affinity}", "meridian", cfg, None, None))
                arms += [(f"meridian, affinity {affinity} + vLLM window {w}", "meridian", cfg,
                          cache_aware_scheduler(MeridianScheduler, w, mode="after-init"), w) for w in windows]
            rows: dict[str, dict[str, Any]] = {}
            for label, policy, cfg, cls, window in arms:
                rows[label] = replay(label, policy, offline, profile, cfg, scale, scheduler_cls=cls, window=window)
                print(line(rows[label], rows["vllm-fcfs"]), flush=True)
            out[f"{name} x{factor:g}"] = {"workload": name, "load_factor": factor, "rate_scale": scale,
                                          "requests": len(offline), "docs_sized_window": docs,
                                          "rows": {k: slim(v) for k, v in rows.items()}}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("sweep", "compose"))
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--load-factors", nargs="+", type=float, default=[1.0, 2.0])
    parser.add_argument("--windows", type=lambda t: [int(w) for w in t.split(",")],
                        default=[2, 4, 8, 16, 32, 64, 128, 256, 1024])
    parser.add_argument("--thresholds", type=lambda t: [float(x) for x in t.split(",") if x], default=[0.0],
                        help="thresholds besides vLLM's default 0.5, each at the docs-sized window and every --windows")
    parser.add_argument("--compose-windows", type=lambda t: [int(w) for w in t.split(",")], default=[64],
                        help="windows besides the docs-sized one for the compose mode")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        results = sweep(args, Path(scratch)) if args.mode == "sweep" else compose(args, Path(scratch))
    print(f"\n({time.monotonic() - started:.0f} s wall)")
    write_results(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
