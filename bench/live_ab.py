"""Live A/B with a real load generator: vLLM's OpenAI server (CPU build, the tiny reasoning model,
the live demo's settings) with the stock scheduler and with ``MeridianScheduler``, driven by
aiperf replaying one seeded, timestamped reasoning workload open-loop, in rounds that alternate
which policy goes first (ABBA BAAB ...), a fresh server each round.

What keeps rounds comparable (issue 12): every round starts from a fresh server on a fresh port
after the previous one's whole process group has exited, waits ``--cooldown-s``, and sends a few
untimed warm-up requests before the timed load; with ``--pin`` (default on two or more cores) the
engine-core process — every thread of it — runs alone on the last core while the API server and
the load generator share the others, so the client does not steal the engine's core. The table
gives per round and per policy the medians over rounds and the spread of TTFO p50 ((max − min) /
median); the ratios are Meridian's medians over stock's, measured side by side in one run.

aiperf is the benchmark's dependency, not the product's: ``make bench-live-setup`` installs the
version pinned in ``bench/requirements-live.txt`` into ``.venv-bench`` (or point ``AIPERF`` at
an aiperf binary).

    .venv/bin/python bench/live_ab.py [--rounds 4] [--rate 6] [--requests 120] [--no-pin] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
# The client-side failures of earlier runs ("Can not write request body", ClientOSError: "Cannot
# write to closing transport"): the API server (uvicorn) closes a keep-alive connection after 5 s
# idle (vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE), aiohttp keeps idle pooled connections for 15 s, so
# under bursty open-loop arrivals the generator writes a request into a connection the server is
# closing. A server keep-alive longer than the client's closes that window; it is a property of
# the HTTP stack, not of either scheduler (it hit the stock server first, in the round's bursts).
os.environ.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "60")

from meridian.demo.live import BASE_ARGS, LIVE_CONFIG  # noqa: E402
from meridian.demo.server import VllmServer, stream_chat  # noqa: E402
from meridian.offline.tiny import task_prompt  # noqa: E402
from meridian.replay.policies import MERIDIAN, STOCK, additional_config  # noqa: E402
from meridian.vllm.names import SCHEDULER_CLS  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "tests" / "fixtures" / "tiny-reasoner"
CACHE = REPO / ".cache"
DEFAULT_AIPERF = REPO / ".venv-bench" / "bin" / "aiperf"
#: aiperf's metrics the table reads (its export's names), with the statistic taken.
METRICS = {
    "ttft_p50_ms": ("time_to_first_token", "p50"), "ttft_p99_ms": ("time_to_first_token", "p99"),
    "ttfo_p50_ms": ("time_to_first_output_token", "p50"), "ttfo_p99_ms": ("time_to_first_output_token", "p99"),
    "itl_p99_ms": ("inter_token_latency", "p99"), "output_tok_s": ("output_token_throughput", "avg"),
    "requests": ("request_count", "avg"), "goodput_rps": ("goodput", "avg"),
}
#: The live class's targets as aiperf's goodput SLOs (ms): first output token, answer ITL.
GOODPUT_SLOS = {"time_to_first_output_token": 15_000.0, "inter_token_latency": 50.0}


@dataclass(frozen=True)
class Workload:
    """A seeded open-loop reasoning workload: Poisson arrivals at ``rate_rps``."""

    num_requests: int
    rate_rps: float
    seed: int = 0

    def jsonl(self) -> str:
        rng = random.Random(self.seed)
        t_ms, lines = 0.0, []
        for _ in range(self.num_requests):
            think, answer = rng.randint(20, 99), rng.randint(5, 26)
            lines.append(json.dumps({"text": task_prompt(think, answer), "timestamp": round(t_ms, 1),
                                     "output_length": 200, "extra": {"temperature": 0.0}}))
            t_ms += rng.expovariate(self.rate_rps) * 1000.0
        return "\n".join(lines) + "\n"


def round_order(num_rounds: int) -> list[str]:
    """ABBA BAAB ...: each policy goes first and second equally often."""
    pattern = ["stock", "meridian", "meridian", "stock", "meridian", "stock", "stock", "meridian"]
    return [pattern[i % len(pattern)] for i in range(num_rounds)]


def server_args(policy: str, step_log: Path, meridian_config: dict[str, Any]) -> list[str]:
    spec = MERIDIAN if policy == "meridian" else STOCK
    args = [*BASE_ARGS, "--scheduling-policy", spec.vllm_policy]
    if spec.meridian_policy is not None:
        config = dict(LIVE_CONFIG, **meridian_config, step_log_path=str(step_log))
        args += ["--scheduler-cls", SCHEDULER_CLS, "--additional-config", json.dumps(additional_config(spec, config))]
    return args


def threads_of(pid: int) -> list[int]:
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


def pin(server: VllmServer) -> dict[str, Any]:
    """Engine core (every thread) alone on the last CPU; the rest of the server on the others."""
    import psutil

    cpus = sorted(os.sched_getaffinity(0))
    engine_cpus, front_cpus = {cpus[-1]}, set(cpus[:-1])
    assert server.process is not None
    root = psutil.Process(server.process.pid)
    placed: dict[str, Any] = {"engine_core": [], "front": []}
    for proc in [root, *root.children(recursive=True)]:
        is_engine = "EngineCore" in " ".join(proc.cmdline()) or "EngineCore" in proc.name()
        for tid in threads_of(proc.pid):
            os.sched_setaffinity(tid, engine_cpus if is_engine else front_cpus)
        placed["engine_core" if is_engine else "front"].append(proc.pid)
    if not placed["engine_core"]:
        raise RuntimeError("no EngineCore process found under the server; cannot pin it")
    return {**placed, "engine_cpus": sorted(engine_cpus), "front_cpus": sorted(front_cpus)}


def aiperf_command(aiperf: Path, url: str, dataset: Path, artifacts: Path, workers: int) -> list[str]:
    cmd = [str(aiperf), "profile", "--model", str(MODEL), "--tokenizer", str(MODEL), "--url", url,
           "--endpoint-type", "chat", "--streaming", "--input-file", str(dataset),
           "--custom-dataset-type", "single_turn", "--fixed-schedule", "--fixed-schedule-auto-offset",
           "--random-seed", "0", "--artifact-dir", str(artifacts), "--ui-type", "none",
           "--workers-max", str(workers)]
    cmd += ["--goodput", " ".join(f"{k}:{v:g}" for k, v in GOODPUT_SLOS.items())]
    return cmd


def read_export(artifacts: Path) -> dict[str, Any]:
    found = sorted(artifacts.rglob("profile_export_aiperf.json"))
    if not found:
        raise RuntimeError(f"aiperf wrote no profile_export_aiperf.json under {artifacts}")
    export = json.loads(found[0].read_text())
    row: dict[str, Any] = {}
    for name, (metric, stat) in METRICS.items():
        value = export.get(metric)
        row[name] = value.get(stat) if isinstance(value, dict) else None
    errors = export.get("error_summary") or []
    row["errors"] = sum(int(e.get("count", 1)) for e in errors)
    row["error_kinds"] = [str(e.get("error_details", e))[:200] for e in errors]
    return row


def meridian_cost(step_log: Path) -> dict[str, float] | None:
    """Meridian's own per-step cost in the live server, from its step log: the median of
    ``meridian_ms`` and its share of the summed step time (``None`` for stock vLLM: no log)."""
    if not step_log.exists():
        return None
    records = [json.loads(line) for line in step_log.read_text().splitlines() if line.strip()]
    if not records:
        return None
    total_step_ms = sum(r["step_ms"] for r in records)
    return {"num_steps": len(records), "median_meridian_ms": statistics.median(r["meridian_ms"] for r in records),
            "median_step_ms": statistics.median(r["step_ms"] for r in records),
            "meridian_share_of_step_time": sum(r["meridian_ms"] for r in records) / total_step_ms if total_step_ms else 0.0}


def run_round(k: int, policy: str, args: argparse.Namespace, dataset: Path) -> dict[str, Any]:
    out: Path = args.out
    step_log = out / f"steps-{k}-{policy}.jsonl"
    step_log.unlink(missing_ok=True)
    with VllmServer(MODEL, server_args(policy, step_log, args.meridian_config), log_path=out / f"serve-{k}-{policy}.log", cache_dir=CACHE) as srv:
        placement = pin(srv) if args.pin else None
        time.sleep(args.cooldown_s)
        for i in range(args.warmup):
            stream_chat(srv.base_url, str(MODEL), task_prompt(20 + i, 5), max_tokens=200)
        artifacts = out / f"aiperf-{k}-{policy}"
        shutil.rmtree(artifacts, ignore_errors=True)
        cmd = aiperf_command(args.aiperf, srv.base_url, dataset, artifacts, args.workers)
        if placement is not None:
            cmd = ["taskset", "-c", ",".join(map(str, placement["front_cpus"])), *cmd]
        started = time.monotonic()
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
        (out / f"aiperf-{k}-{policy}.log").write_text(result.stdout + result.stderr)
        if result.returncode != 0:
            raise RuntimeError(f"aiperf exited with {result.returncode}; log: {out / f'aiperf-{k}-{policy}.log'}")
        row = {"round": k, "policy": policy, "wall_s": time.monotonic() - started, "placement": placement,
               **read_export(artifacts)}
    row["meridian_cost"] = meridian_cost(step_log)
    print(f"round {k} {policy:8s} TTFO p50/p99 {row['ttfo_p50_ms']:.0f}/{row['ttfo_p99_ms']:.0f} ms  "
          f"TTFT p50 {row['ttft_p50_ms']:.0f} ms  ITL p99 {row['itl_p99_ms']:.1f} ms  "
          f"{row['output_tok_s']:.0f} tok/s  errors {row['errors']}"
          + (f"  Meridian {row['meridian_cost']['meridian_share_of_step_time']:.1%} of step time"
             if row["meridian_cost"] else ""), flush=True)
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per policy: the median over rounds of every metric and the spread of TTFO p50; Meridian's
    medians over stock's."""
    out: dict[str, Any] = {}
    for policy in ("stock", "meridian"):
        mine = [r for r in rows if r["policy"] == policy]
        med = {m: statistics.median(v) for m in METRICS if (v := [r[m] for r in mine if r[m] is not None])}
        p50s = [r["ttfo_p50_ms"] for r in mine if r["ttfo_p50_ms"] is not None]
        spread = (max(p50s) - min(p50s)) / statistics.median(p50s) if len(p50s) > 1 else None
        out[policy] = {"median": med, "ttfo_p50_spread": spread, "errors": sum(r["errors"] for r in mine),
                       "rounds": len(mine)}
    stock, ours = out["stock"]["median"], out["meridian"]["median"]
    out["meridian_over_stock"] = {m: ours[m] / stock[m] for m in ours if m in stock and stock[m]}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rate", type=float, default=6.0, help="arrivals per second (Poisson, seeded)")
    parser.add_argument("--requests", type=int, default=120)
    parser.add_argument("--warmup", type=int, default=3, help="untimed requests before each round")
    parser.add_argument("--cooldown-s", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=2, help="aiperf's --workers-max")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=len(os.sched_getaffinity(0)) >= 2)
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--meridian-config", type=json.loads, default={},
                        help="JSON merged into Meridian's config (the live demo's class), e.g. '{\"answer_kv_reserve\": false}'")
    parser.add_argument("--aiperf", type=Path, default=Path(os.environ.get("AIPERF", DEFAULT_AIPERF)))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / f"live_ab_{time.strftime('%Y-%m-%d')}")
    args = parser.parse_args()
    if not args.aiperf.exists():
        print(f"no aiperf at {args.aiperf}: run `make bench-live-setup` or set AIPERF", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    dataset = args.out / "workload.jsonl"
    dataset.write_text(Workload(args.requests, args.rate).jsonl())
    rows = [run_round(k, policy, args, dataset) for k, policy in enumerate(round_order(args.rounds))]
    summary = summarize(rows)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    (args.out / "results.json").write_text(json.dumps({"settings": settings, "rounds": rows, "summary": summary}, indent=2) + "\n")
    for policy in ("stock", "meridian"):
        s = summary[policy]
        spread = "-" if s["ttfo_p50_spread"] is None else f"{s['ttfo_p50_spread']:.0%}"
        print(f"{policy:8s} median over {s['rounds']} rounds: " + "  ".join(f"{m} {v:.1f}" for m, v in s["median"].items())
              + f"  TTFO p50 spread {spread}  errors {s['errors']}")
    print("meridian / stock: " + "  ".join(f"{m} {v:.2f}×" for m, v in summary["meridian_over_stock"].items()))
    print(f"wrote {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
