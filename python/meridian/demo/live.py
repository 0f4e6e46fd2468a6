"""The live part of ``meridian demo``: vLLM's OpenAI-compatible server (CPU build) serving the
tiny reasoning model twice — stock scheduler, then ``MeridianScheduler`` — under the same burst
of concurrent streaming reasoning requests with a KV cache small enough to force waiting and
preemption. Latencies are measured by the clients in wall-clock time (DESIGN §4); preemptions
come from vLLM's own ``/metrics`` (both servers) and, by phase, from Meridian's request log.
Invariant: both servers get the same arguments but the scheduler's, and the same prompts.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meridian.demo.server import StreamResult, VllmServer, stream_chat
from meridian.offline.tiny import task_prompt
from meridian.replay.policies import MERIDIAN, STOCK, additional_config, policy_spec
from meridian.vllm.names import SCHEDULER_CLS

#: Where the tiny model fixture lives in a source checkout (the README's commands run from its root).
DEFAULT_MODEL = Path("tests") / "fixtures" / "tiny-reasoner"
#: 1 KiB of KV per token for the tiny model: 640 tokens of cache (20 blocks of 32).
KV_CACHE_BYTES = 640 * 1024
BASE_ARGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "512", "--block-size", "32",
             "--kv-cache-memory-bytes", str(KV_CACHE_BYTES), "--max-num-seqs", "16", "--reasoning-parser", "deepseek_r1"]
#: The live demo's class: answer TPOT target 50 ms (a stall is a gap above 250 ms).
LIVE_CONFIG = {"default_class": "interactive", "priority_map": {"0": "interactive"}}
ANSWER_TPOT_TARGET_MS = 50.0
STALL_FACTOR = 5.0


@dataclass(frozen=True)
class LiveWorkload:
    """A burst of ``num_requests`` reasoning requests (seeded think/answer lengths)."""

    num_requests: int = 24
    think: tuple[int, int] = (20, 99)
    answer: tuple[int, int] = (5, 26)
    seed: int = 0

    def prompts(self) -> list[tuple[int, int]]:
        rng = random.Random(self.seed)
        return [(rng.randint(*self.think), rng.randint(*self.answer)) for _ in range(self.num_requests)]


def run_live(policy: str, workload: LiveWorkload, model: Path, cache_dir: Path, work_dir: Path,
             progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Serves the workload under ``policy`` (``vllm-fcfs`` or ``meridian``, names of
    ``meridian.replay.policies``) and returns its metrics."""
    spec = policy_spec(policy)
    work_dir.mkdir(parents=True, exist_ok=True)
    args = [*BASE_ARGS, "--scheduling-policy", spec.vllm_policy]
    request_log = work_dir / f"{policy}-requests.jsonl"
    if spec.meridian_policy is not None:
        request_log.unlink(missing_ok=True)
        config = dict(LIVE_CONFIG, request_log_path=str(request_log))
        args += ["--scheduler-cls", SCHEDULER_CLS, "--additional-config", json.dumps(additional_config(spec, config))]
    if not (model / "model.safetensors").exists():
        raise FileNotFoundError(f"no model weights in {model} (run from the repository root, or pass --model)")
    model = model.resolve()
    started = time.monotonic()
    with VllmServer(model, args, log_path=work_dir / f"{policy}-serve.log", cache_dir=cache_dir) as server:
        progress(f"    server up in {time.monotonic() - started:.0f}s; sending {workload.num_requests} streaming requests")
        burst_start = time.monotonic()
        results: list[StreamResult] = []
        with ThreadPoolExecutor(workload.num_requests) as pool:
            futures = [pool.submit(stream_chat, server.base_url, str(model), task_prompt(n, m))
                       for n, m in workload.prompts()]
            for done, future in enumerate(as_completed(futures), 1):
                results.append(future.result())
                if done % 6 == 0 or done == len(futures):
                    progress(f"    {done}/{len(futures)} done ({time.monotonic() - burst_start:.1f}s)")
        wall_s = time.monotonic() - burst_start
        preemptions = prometheus_total(server.base_url, "vllm:num_preemptions_total")
    metrics = summarize_live(results, wall_s)
    metrics["preemptions"] = preemptions
    if spec.meridian_policy is not None and request_log.exists():
        ledger = [json.loads(line) for line in request_log.read_text().splitlines()]
        for phase in ("prefill", "think", "answer"):
            metrics[f"preemptions_{phase}"] = float(sum(e[f"num_preemptions_{phase}"] for e in ledger))
    return metrics


def summarize_live(results: list[StreamResult], wall_s: float) -> dict[str, Any]:
    """Client-side DESIGN §4 metrics in milliseconds."""
    ttft, ttfat, gaps, tpot = [], [], [], []
    stalls = 0
    tokens = 0
    for r in results:
        if r.status != 200 or r.error:
            continue
        first_any = min((r.reasoning_times_s[:1] + r.content_times_s[:1]), default=None)
        if first_any is not None:
            ttft.append((first_any - r.sent_s) * 1e3)
        if r.content_times_s:
            ttfat.append((r.content_times_s[0] - r.sent_s) * 1e3)
            answer_gaps = [(b - a) * 1e3 for a, b in zip(r.content_times_s, r.content_times_s[1:])]
            gaps.extend(answer_gaps)
            stalls += sum(g > STALL_FACTOR * ANSWER_TPOT_TARGET_MS for g in answer_gaps)
            if answer_gaps:
                tpot.append(statistics.fmean(answer_gaps))
        tokens += len(r.reasoning.split()) + len(r.content.split())

    def pct(xs: list[float], q: float) -> float:
        return sorted(xs)[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")

    return {
        "completed": float(sum(r.status == 200 and not r.error and r.finish_reason == "stop" for r in results)),
        "ttft_p50_ms": pct(ttft, 0.5), "ttft_p99_ms": pct(ttft, 0.99),
        "ttfat_p50_ms": pct(ttfat, 0.5), "ttfat_p99_ms": pct(ttfat, 0.99),
        "answer_tpot_mean_ms": statistics.fmean(tpot) if tpot else float("nan"),
        "answer_itl_p99_ms": pct(gaps, 0.99), "answer_itl_max_ms": max(gaps, default=float("nan")),
        "answer_stalls": float(stalls),
        "throughput_tok_s": tokens / wall_s if wall_s > 0 else float("nan"),
        "wall_s": wall_s,
    }


def prometheus_total(base_url: str, name: str) -> float:
    """Sum of every sample of one metric on a vLLM server's ``/metrics`` page."""
    import httpx

    text = httpx.get(f"{base_url}/metrics", timeout=10.0).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


#: (metric key, label) of the table, in order.
ROWS = [
    ("completed", "completed requests"),
    ("preemptions", "preemptions (vLLM /metrics)"),
    ("preemptions_think", "  of which thinking (Meridian ledger)"),
    ("preemptions_answer", "  of which answering (Meridian ledger)"),
    ("answer_stalls", "answer stalls (gap > 250 ms)"),
    ("answer_itl_p99_ms", "answer ITL p99 [ms]"),
    ("answer_itl_max_ms", "answer ITL max [ms]"),
    ("answer_tpot_mean_ms", "answer TPOT mean [ms]"),
    ("ttft_p50_ms", "TTFT p50 [ms]"),
    ("ttfat_p50_ms", "TTFAT p50 [ms]"),
    ("ttfat_p99_ms", "TTFAT p99 [ms]"),
    ("throughput_tok_s", "throughput [tokens/s]"),
]


def run_part(model: Path | None, cache_dir: Path, num_requests: int) -> dict[str, object]:
    """The demo part: the burst against a stock server, then against Meridian, as one table."""
    workload = LiveWorkload(num_requests=num_requests)
    print(
        f"\nLive: vLLM's OpenAI server (CPU build) serving the tiny reasoning model, {num_requests} concurrent "
        "streaming requests (think 20-99, answer 5-26 tokens), 640-token KV cache; wall-clock latencies.",
        flush=True,
    )
    results: dict[str, dict[str, float]] = {}
    for policy in (STOCK.name, MERIDIAN.name):
        print(f"  {policy}: starting the server ...", flush=True)
        results[policy] = run_live(policy, workload, model or DEFAULT_MODEL, cache_dir, cache_dir / "live",
                                   progress=lambda line: print(line, flush=True))
    print()
    print(render(results))
    return {"workload": workload.__dict__, "results": results}


def render(results: dict[str, dict[str, float]]) -> str:
    """The side-by-side table."""

    def fmt(v: float | None) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        return f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"

    width = max(len(label) for _, label in ROWS) + 2
    lines = [f"{'metric':<{width}}{'stock vLLM':>14}{'Meridian':>14}", "-" * (width + 28)]
    stock, ours = results[STOCK.name], results[MERIDIAN.name]
    lines += [f"{label:<{width}}{fmt(stock.get(key)):>14}{fmt(ours.get(key)):>14}" for key, label in ROWS]
    return "\n".join(lines)
