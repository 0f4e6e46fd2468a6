"""The thinking part of ``meridian demo``: one vLLM server (CPU build) with ``MeridianScheduler``
and ``MeridianThinkingProcessor`` serving the tiny reasoning model. The same prompts run under
each thinking-control rule, one rule per request through ``vllm_xargs``, and the table shows the
thinking tokens each rule saved, whether the answer still followed intact, and which rule the
request log says fired. The tiny model cannot judge answer quality, so the table claims none.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meridian.testing.server import VllmServer, stream_chat
from meridian.testing.thinking_modes import MODES, PROCESSOR_ARGS, server_config_json
from meridian.testing.train_tiny import LETTERS

SERVER_ARGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "256", "--block-size", "32",
               "--kv-cache-memory-bytes", str(4 << 20), "--max-num-seqs", "8", "--reasoning-parser", "deepseek_r1",
               "--scheduler-cls", "meridian.vllm.MeridianScheduler"]
#: (thinking N, answer M) of each prompt.
PROMPTS = [(30, 5), (60, 5), (90, 5)]
#: Modes shown (the two "off" modes are one row; the load-aware row runs its class twice, so the
#: second request sees the class's attainment from the first).
SHOWN = ["off (no arguments)", "budget 12", "eat", "proxy", "rpdi", "load-aware (strict class)"]


def run_thinking(model: Path, cache_dir: Path, out_dir: Path, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Runs every shown mode on every prompt; returns per-mode thinking tokens and answer checks."""
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "thinking-requests.jsonl"
    log.unlink(missing_ok=True)
    args = SERVER_ARGS + PROCESSOR_ARGS + ["--additional-config", server_config_json({"request_log_path": str(log)})]
    results: dict[str, Any] = {}
    with VllmServer(model, args, log_path=out_dir / "thinking-serve.log", cache_dir=cache_dir) as server:
        for mode in SHOWN:
            xargs = MODES[mode]
            extra = {"vllm_xargs": xargs} if xargs is not None else None
            thought, intact = [], []
            for n, m in PROMPTS:
                if mode.startswith("load-aware"):
                    # A first request of the class completes (and misses its target) before the
                    # measured one; the scheduler publishes the attainment, the worker reads it.
                    stream_chat(server.base_url, str(model), f"think {n} answer {m}", max_tokens=200, extra=extra)
                    time.sleep(0.6)
                r = stream_chat(server.base_url, str(model), f"think {n} answer {m}", max_tokens=200, extra=extra)
                thought.append(len(r.reasoning.split()))
                intact.append(r.status == 200 and r.content.split() == LETTERS[:m])
            results[mode] = {"thinking_tokens": thought, "answers_intact": all(intact)}
            progress(f"  {mode:<28} thinking tokens {thought}")
    time.sleep(0.5)
    stops = [json.loads(line).get("thinking_stopped_by") for line in log.read_text().splitlines()] if log.exists() else []
    named = ["none" if stop is None else str(stop) for stop in stops]
    results["stopped_by_counts"] = {name: named.count(name) for name in sorted(set(named))}
    return results


def render(results: dict[str, Any]) -> str:
    """The table: mean thinking tokens per mode, saved against control off, answers intact."""
    base = statistics.mean(results["off (no arguments)"]["thinking_tokens"])
    lines = [f"{'rule':<28}{'thinking tokens':>17}{'saved':>9}{'answers intact':>16}", "-" * 70]
    for mode in SHOWN:
        row = results[mode]
        mean = statistics.mean(row["thinking_tokens"])
        saved = "-" if mode.startswith("off") else f"{1 - mean / base:.0%}"
        tokens = "/".join(str(t) for t in row["thinking_tokens"])
        lines.append(f"{mode:<28}{tokens:>17}{saved:>9}{'yes' if row['answers_intact'] else 'NO':>16}")
    counts = ", ".join(f"{k}: {v}" for k, v in results["stopped_by_counts"].items())
    lines.append(f"request log, thinking_stopped_by: {counts}")
    return "\n".join(lines)
