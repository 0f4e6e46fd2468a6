"""Live: the host KV tier on vLLM's CPU build — stock vLLM and Meridian, each without and with
the tier, under the same KV pressure, side by side in one run. Every configuration serves the
same trained fixture with the same small KV cache (``LIVE_MODELS``: 320 tokens for ``tiny``, 512
for ``compute``, so KV is the binding limit and requests are preempted) and is driven by aiperf
replaying the same seeded, timestamped, three-class workload file open-loop (``bench/live_ab.py``'s
measurement, ``meridian.demo.loadgen``). The tier is the README's ``--kv-transfer-config``
(``MeridianOffloadingConnector`` on ``HostCopyOffloadingSpec``, ``offload_prompt_only: false`` so
a preempted request's thinking is stored and can come back, ``kv_load_failure_policy:
recompute``), ``--tier-mib`` of host memory (default 64: far more than a round's live KV).

Configurations: ``stock``, ``stock+tier``, ``meridian``, ``meridian+tier`` (``kv_tier.restore:
always``) and ``meridian+tier:auto`` (the default, ``auto``). ``always`` is the configuration
compared with stock: it loads every hit, as vLLM's scheduler does, so the with/without ratios of
the two schedulers measure the same mechanism. ``auto`` is what Meridian does out of the box: the
core prices a hit as one extra engine step (vLLM loads asynchronously and schedules the request
the step after) plus the load, against recomputing it at the step-time model's prefill cost; on
the tiny CPU model a step costs milliseconds of Python while recomputing a few dozen tokens costs
almost nothing, so auto recomputes short hits there and loads only in a busy batch
(``tests/live/test_kv_tier_live.py`` uses ``always`` for that reason; in an 80-request smoke round
auto loaded 896 tokens where always loaded 2048) — its row shows what that choice costs or saves
live. ``--configs`` picks a subset.

Rounds alternate the order (ABCDE EDCBA ...), each on a fresh server after the previous one's
process group has exited, with ``--cooldown-s``, untimed warm-up requests and, with ``--pin``
(default on two or more cores), the engine alone on the last core (``loadgen.run_round``). Every
server runs with ``VLLM_CPU_NUM_OF_RESERVED_CPU=1``: without it vLLM's CPU build reserves an extra
core for any KV connector, which on two cores gives the tier servers' model worker two OpenMP
threads where the others get one (24x slower in a smoke run; see the comment at the top).

Per round: TTFO p50/p99 and TTFT p50 (aiperf), output throughput, goodput against the class
targets, failed requests; from vLLM's own ``/metrics``, read just before and (settled) just after
the timed load, so the same counters measure both schedulers: preemptions, the tier's stored and
loaded bytes in tokens (bytes over the model's KV bytes per token, float32 K and V of every
layer), and how the KV of preempted requests came back when they were resumed — from the device's
prefix cache, loaded from the tier, or recomputed. vLLM counts the last three in its scheduler
stats (``PrefixCacheStats.preempted_*``: tokens of a resumed request at its admission, its device
prefix-cache hit, its connector hit) but does not export them, so this script registers a vLLM
stat-logger plugin (entry point group ``vllm.stat_logger_plugins``, a throw-away distribution on
the servers' ``PYTHONPATH``; the code is ``RESUME_STATS_PLUGIN`` below) that adds them to
``/metrics`` as ``kv_bench:*`` counters. Recomputed tokens = tokens at resumption − device hit −
tier hit − one per resumption (the last sampled token, whose KV a decode step computes anyway).
Meridian's ``auto`` reports a hit it prices dearer than its recompute as no hit, so it counts as
recomputed, as it is. Only full blocks (32 tokens) are kept, by the device's prefix cache and by
the tier alike: a resumed request's partial last block is always recomputed, so even a tier that
loads every hit leaves some recomputed tokens, the more the further from a block boundary the
scheduler's victims were. Meridian's request log adds preemptions by phase.

Summary: per configuration the medians over its rounds, the spread ((max − min) / median) of TTFO
p50 and of throughput, and the speed probe before and after each round (a fixed single-threaded
load on the engine's core: the machine's own drift, up to ~1.8× between minutes on this VM); the
ratios with tier / without for each scheduler, and Meridian / stock at the same tier setting. A
ratio is only as good as the spreads and probes beside it.

    .venv/bin/python bench/kv_tier.py [--model tiny|compute] [--rounds 2] [--configs stock,stock+tier,...]
    .venv/bin/python bench/kv_tier.py --rounds 1 --requests 80 --out /tmp/kv_tier_smoke   # smoke

Results go to ``bench/results/kv_tier_<model>_<date>/`` (``results.json``, the workload, per round
aiperf's summary and gzipped per-request export, server and aiperf logs gzipped, Meridian's logs
gzipped); ``--json PATH`` writes the JSON there too.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
# As in bench/live_ab.py: a server keep-alive longer than aiohttp's pool keeps the generator from
# writing into connections the server is closing.
os.environ.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "60")
# vLLM's CPU build reserves one more core when any --kv-transfer-config is set (for NIXL's P/D
# transfers, utils/ompmultiprocessing.py). On two cores that leaves nothing to reserve, so the
# model worker of a tier server gets two OpenMP threads bound to both cores where the others get
# one — on the engine's single pinned core two spinning OpenMP threads made the first smoke run's
# stock+tier round 24x slower (41 against 988 tok/s), a cost of the thread layout, not of the tier.
# One reserved core, the count vLLM reserves without a connector, gives every configuration the
# same layout.
os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")

from meridian.demo.loadgen import (  # noqa: E402
    RoundSettings,
    Workload,
    add_round_arguments,
    pack_round,
    round_settings,
    run_round,
    spread,
)

REPO = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Config:
    """One server configuration: the scheduler, the tier, Meridian's restore mode."""

    name: str
    policy: str
    tier: bool
    restore: str | None = None  # Meridian's kv_tier.restore; None: not set

    @property
    def slug(self) -> str:
        return self.name.replace("+", "-").replace(":", "-")


CONFIGS = {c.name: c for c in (
    Config("stock", "stock", tier=False),
    Config("stock+tier", "stock", tier=True),
    Config("meridian", "meridian", tier=False),
    Config("meridian+tier", "meridian", tier=True, restore="always"),
    Config("meridian+tier:auto", "meridian", tier=True, restore="auto"),
)}
#: Each tier configuration and the one without the tier it is compared with.
BASELINE = {"stock+tier": "stock", "meridian+tier": "meridian", "meridian+tier:auto": "meridian"}
#: Meridian over stock at the same tier setting.
CROSS = {"meridian": "stock", "meridian+tier": "stock+tier"}


def tier_config(cpu_bytes: int) -> dict[str, Any]:
    """The README's ``--kv-transfer-config`` for the host tier."""
    return {"kv_connector": "MeridianOffloadingConnector", "kv_connector_module_path": "meridian.vllm.kvtier",
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"spec_name": "HostCopyOffloadingSpec", "spec_module_path": "meridian.vllm.kvtier",
                                          "cpu_bytes_to_use": cpu_bytes, "offload_prompt_only": False}}


# ---- vLLM's resume accounting on /metrics ----------------------------------------------------

#: The stat-logger plugin the servers load (module ``kv_bench_resume_stats``). It runs in the API
#: server, where vLLM's Prometheus logger runs, and sees the same ``SchedulerStats``.
RESUME_STATS_PLUGIN = '''\
"""Written by bench/kv_tier.py: vLLM's accounting of resumed (preempted) requests on /metrics."""
import sys

from prometheus_client import Counter
from vllm.v1.metrics.loggers import StatLoggerBase

_COUNTERS = {}


def _counter(name, documentation):
    if name not in _COUNTERS:  # one registry per process, however many loggers vLLM builds
        _COUNTERS[name] = Counter(name, documentation)
    return _COUNTERS[name]


class ResumeStats(StatLoggerBase):
    def __init__(self, vllm_config, engine_index=0):
        self.resumes = _counter("kv_bench:resumes", "Admissions of previously preempted requests.")
        self.tokens = _counter("kv_bench:resume_tokens", "Tokens of resumed requests at their admission.")
        self.device = _counter("kv_bench:resume_device_hit_tokens", "Of those, found in the device prefix cache.")
        self.tier = _counter("kv_bench:resume_tier_hit_tokens", "Of those, loaded through the KV connector.")
        print("kv_bench: resume stats logger loaded", file=sys.stderr, flush=True)

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
        if scheduler_stats is None:
            return
        local = scheduler_stats.prefix_cache_stats
        if local is not None:
            self.resumes.inc(local.preempted_requests)
            self.tokens.inc(local.preempted_queries)
            self.device.inc(local.preempted_hits)
        connector = scheduler_stats.connector_prefix_cache_stats
        if connector is not None:
            self.tier.inc(connector.preempted_hits)

    def log_engine_initialized(self):
        pass
'''
PLUGIN_LOADED = "kv_bench: resume stats logger loaded"


def install_resume_stats(folder: Path) -> None:
    """Writes the plugin and a distribution naming it under ``folder`` and puts ``folder`` on the
    ``PYTHONPATH`` the servers inherit (vLLM finds stat-logger plugins by entry point)."""
    (folder / "kv_bench_resume_stats.py").write_text(RESUME_STATS_PLUGIN)
    dist = folder / "kv_bench_resume_stats-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kv-bench-resume-stats\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[vllm.stat_logger_plugins]\nkv_bench_resume_stats = kv_bench_resume_stats:ResumeStats\n")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)


#: ``/metrics`` samples read around each round's timed load (their increase).
SERVER_METRICS = (
    "vllm:num_preemptions_total",
    "vllm:kv_offload_store_bytes_total", "vllm:kv_offload_load_bytes_total",
    "vllm:kv_offload_store_time_total", "vllm:kv_offload_load_time_total",
    "vllm:external_prefix_cache_hits_total", "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "kv_bench:resumes_total", "kv_bench:resume_tokens_total",
    "kv_bench:resume_device_hit_tokens_total", "kv_bench:resume_tier_hit_tokens_total",
)


def tier_figures(server_metrics: dict[str, float], kv_bytes_per_token: float) -> dict[str, float | None]:
    """A round's tier and resume figures, in tokens, from the increase of ``SERVER_METRICS``."""
    m = server_metrics
    resumes = m["kv_bench:resumes_total"]
    device, tier = m["kv_bench:resume_device_hit_tokens_total"], m["kv_bench:resume_tier_hit_tokens_total"]
    recomputed = max(0.0, m["kv_bench:resume_tokens_total"] - device - tier - resumes)
    return {
        "preemptions_metric": m["vllm:num_preemptions_total"],
        "tier_stored_tokens": m["vllm:kv_offload_store_bytes_total"] / kv_bytes_per_token,
        "tier_loaded_tokens": m["vllm:kv_offload_load_bytes_total"] / kv_bytes_per_token,
        "tier_store_s": m["vllm:kv_offload_store_time_total"],
        "tier_load_s": m["vllm:kv_offload_load_time_total"],
        "resumes": resumes,
        "resume_tokens": m["kv_bench:resume_tokens_total"],
        "restored_device_tokens": device,
        "restored_tier_tokens": tier,
        "recomputed_tokens": recomputed,
        "restored_tier_share": tier / (tier + recomputed) if tier + recomputed else None,
        # Tier hits of requests never preempted (prompts another request stored): none expected,
        # the workload's prompts are shorter than a block.
        "new_request_tier_hit_tokens": m["vllm:external_prefix_cache_hits_total"],
    }


# ---- rounds and summary -----------------------------------------------------------------------


def round_order(configs: list[str], rounds: int) -> list[str]:
    """ABCD DCBA ...: every configuration at every position of the order equally often over pairs."""
    return [name for k in range(rounds) for name in (configs if k % 2 == 0 else configs[::-1])]


#: Summarized as medians per configuration (and as ratios where a baseline is given).
TABLE = [
    ("ttfo_p50_ms", "TTFO p50 ms", "{:.0f}"), ("ttfo_p99_ms", "TTFO p99 ms", "{:.0f}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"), ("output_tok_s", "output tok/s", "{:.0f}"),
    ("goodput_rps", "goodput req/s", "{:.2f}"), ("good_requests", "good requests", "{:.0f}"),
    ("failed", "failed requests", "{:.0f}"), ("preemptions", "preemptions", "{:.0f}"),
    ("resumes", "resumes", "{:.0f}"), ("tier_stored_tokens", "tier stored tok", "{:.0f}"),
    ("tier_loaded_tokens", "tier loaded tok", "{:.0f}"), ("restored_tier_tokens", "resumed: tier tok", "{:.0f}"),
    ("restored_device_tokens", "resumed: device tok", "{:.0f}"), ("recomputed_tokens", "resumed: recomputed tok", "{:.0f}"),
    ("tier_load_s", "tier load s", "{:.3f}"), ("tier_store_s", "tier store s", "{:.3f}"),
]
RATIO_METRICS = ["ttfo_p50_ms", "ttfo_p99_ms", "ttft_p50_ms", "output_tok_s", "goodput_rps", "preemptions",
                 "recomputed_tokens"]


def summarize(rows: list[dict[str, Any]], configs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in configs:
        mine = [r for r in rows if r["config"] == name]
        med = {m: statistics.median(v) for m, _, _ in TABLE if (v := [r[m] for r in mine if r.get(m) is not None])}
        probes = [p for r in mine for p in r["speed_probe_ms"].values()]
        out[name] = {
            "rounds": len(mine), "median": med,
            "ttfo_p50_spread": spread([r["ttfo_p50_ms"] for r in mine]),
            "output_tok_s_spread": spread([r["output_tok_s"] for r in mine]),
            "speed_probe_ms": probes, "speed_probe_median_ms": statistics.median(probes) if probes else None,
            "failed_requests": sum(r["failed"] for r in mine),
            "preemptions_by_phase": [r["preemptions_by_phase"] for r in mine if r.get("preemptions_by_phase")],
            "resume_stats_loaded": all(r["resume_stats_loaded"] for r in mine),
        }

    def ratios(pairs: dict[str, str]) -> dict[str, dict[str, float | None]]:
        result = {}
        for a, b in pairs.items():
            if a in out and b in out:
                ma, mb = out[a]["median"], out[b]["median"]
                result[f"{a} / {b}"] = {m: (ma[m] / mb[m] if mb.get(m) else None) for m in RATIO_METRICS if m in ma}
        return result

    all_probes = [p for r in rows for p in r["speed_probe_ms"].values()]
    return {"configs": out, "with_over_without_tier": ratios(BASELINE), "meridian_over_stock": ratios(CROSS),
            "speed_probe_spread": spread(all_probes), "speed_probe_ms_range": [min(all_probes), max(all_probes)]}


def pack(out: Path, name: str, records: list[Any]) -> None:
    """``live_ab.pack_round``, and the server's and aiperf's logs gzipped."""
    pack_round(out, name, records)
    for path in (out / f"serve-{name}.log", out / f"aiperf-{name}.log"):
        if path.exists():
            with path.open("rb") as src, gzip.open(f"{path}.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            path.unlink()


def run_rounds(args: argparse.Namespace, settings: RoundSettings) -> list[dict[str, Any]]:
    dataset = args.out / "workload.jsonl"
    dataset.write_text(Workload(args.requests, args.rate, settings.model.classes).jsonl())
    kv_bytes_per_token = settings.model.kv_cache_bytes(REPO) / settings.model.kv_cache_tokens
    tier_args = ("--kv-transfer-config", json.dumps(tier_config(args.tier_mib * 1024 * 1024)))
    rows = []
    for k, name in enumerate(round_order(args.configs, args.rounds)):
        config = CONFIGS[name]
        meridian = {**args.meridian_config, **({"kv_tier": {"restore": config.restore}} if config.restore else {})}
        round_settings = dataclasses.replace(settings, meridian_config=meridian,
                                             extra_server_args=tier_args if config.tier else ())
        label = f"{k}-{config.slug}"
        started = time.monotonic()
        row, records = run_round(label, config.policy, dataset, args.out, round_settings)
        row["resume_stats_loaded"] = PLUGIN_LOADED in (args.out / f"serve-{label}.log").read_text(errors="replace")
        pack(args.out, label, records)
        row.update({"round": k, "config": name, "tier": config.tier, "restore": config.restore,
                    "failed": row["errors"] + row["failed_in_records"], "round_wall_s": time.monotonic() - started,
                    **tier_figures(row["server_metrics"], kv_bytes_per_token)})
        rows.append(row)
        print_round(row)
    return rows


def print_round(r: dict[str, Any]) -> None:
    probe = r["speed_probe_ms"]
    by_phase = r.get("preemptions_by_phase")
    print(f"{r['round']:>2} {r['config']:<19} TTFO p50/p99 {r['ttfo_p50_ms']:.0f}/{r['ttfo_p99_ms']:.0f} ms  "
          f"TTFT p50 {r['ttft_p50_ms']:.0f} ms  {r['output_tok_s']:.0f} tok/s  good {r['good_requests']}/{r['requests']:.0f}  "
          f"failed {r['failed']}  preempted {r['preemptions']:.0f}"
          + (f" (think {by_phase['think']}, answer {by_phase['answer']})" if by_phase else "")
          + f"  tier stored/loaded {r['tier_stored_tokens']:.0f}/{r['tier_loaded_tokens']:.0f} tok  resumed: "
          f"tier {r['restored_tier_tokens']:.0f} device {r['restored_device_tokens']:.0f} recomputed {r['recomputed_tokens']:.0f} tok  "
          f"probe {probe['before']:.0f}/{probe['after']:.0f} ms  {r['round_wall_s']:.0f} s", flush=True)


def print_summary(summary: dict[str, Any], configs: list[str]) -> None:
    cells = summary["configs"]
    width = max(12, *(len(c) + 1 for c in configs))
    print("\nmedians over rounds" + "".join(f"{c:>{width}}" for c in configs))
    for key, label, fmt in TABLE:
        values = [cells[c]["median"].get(key) for c in configs]
        print(f"{label:<24}" + "".join(f"{'-' if v is None else fmt.format(v):>{width}}" for v in values))
    for key, label in (("ttfo_p50_spread", "TTFO p50 spread"), ("output_tok_s_spread", "tok/s spread")):
        values = [cells[c][key] for c in configs]
        print(f"{label:<24}" + "".join(f"{'-' if v is None else f'{v:.0%}':>{width}}" for v in values))
    print(f"{'speed probe ms (median)':<24}" + "".join(f"{cells[c]['speed_probe_median_ms']:>{width}.0f}" for c in configs))
    print(f"{'rounds':<24}" + "".join(f"{cells[c]['rounds']:>{width}}" for c in configs))
    lo, hi = summary["speed_probe_ms_range"]
    sp = summary["speed_probe_spread"]
    print(f"machine: speed probe {lo:.0f}–{hi:.0f} ms over the run (spread {'-' if sp is None else f'{sp:.0%}'})")
    for title, block in (("with tier / without", summary["with_over_without_tier"]),
                         ("meridian / stock", summary["meridian_over_stock"])):
        for pair, ratios in block.items():
            print(f"{title:<20} {pair:<32} " + "  ".join(
                f"{m.removesuffix('_ms')} {'-' if v is None else f'{v:.2f}×'}" for m, v in ratios.items()))
    if not all(cells[c]["resume_stats_loaded"] for c in configs):
        print("warning: the resume stats plugin did not load in every server: resume figures read 0 there")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_round_arguments(parser)
    parser.add_argument("--rounds", type=int, default=2, help="rounds per configuration")
    parser.add_argument("--configs", type=lambda s: s.split(","), default=list(CONFIGS),
                        help=f"comma-separated, in first-round order (default: {','.join(CONFIGS)})")
    parser.add_argument("--tier-mib", type=int, default=64, help="host tier size (cpu_bytes_to_use) in MiB")
    parser.add_argument("--meridian-config", type=json.loads, default={},
                        help="JSON merged into every Meridian configuration (kv_tier.restore is set per configuration)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results JSON here")
    args = parser.parse_args()
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown or len(set(args.configs)) != len(args.configs):
        parser.error(f"--configs: unknown or repeated {unknown or args.configs}; known: {', '.join(CONFIGS)}")
    try:
        settings = round_settings(args, REPO, "kv_tier", server_metrics=SERVER_METRICS)
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 2
    model = settings.model
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kv_bench_plugin_") as plugin_dir:
        install_resume_stats(Path(plugin_dir))
        rows = run_rounds(args, settings)
    summary = summarize(rows, args.configs)
    print_summary(summary, args.configs)
    saved = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result = {"settings": saved, "model": model.name, "kv_cache_tokens": model.kv_cache_tokens,
              "kv_bytes_per_token": model.kv_cache_bytes(REPO) / model.kv_cache_tokens,
              "tier": tier_config(args.tier_mib * 1024 * 1024), "wall_s": time.monotonic() - started,
              "rounds": rows, "summary": summary}
    text = json.dumps(result, indent=2, default=str) + "\n"
    (args.out / "results.json").write_text(text)
    if args.json is not None:
        args.json.write_text(text)
    print(f"wrote {args.out / 'results.json'} ({result['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
