"""``meridian demo``: stock vLLM and Meridian side by side, in four parts.

``scripted`` (the KV-pressure scenario through vLLM's real schedulers on the offline engine),
``replay`` (a real trace excerpt in virtual time), ``live`` (vLLM's OpenAI server on the CPU
build under aiperf, a real load generator: a short run of the live A/B; ``loadgen`` drives it) and ``thinking`` (thinking control on a live server);
``server`` starts and talks to a real ``vllm serve`` for the live parts and the live tests.
Invariant: the demo measures, it never decides: every number comes from vLLM's schedulers, the
core's ledger or the clients.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

#: Every part, in the order they run.
PARTS = ("scripted", "replay", "live", "thinking")


def run_demo(
    parts: Sequence[str],
    *,
    seeds: list[int],
    cache_dir: Path,
    model: Path | None,
    live_requests: int | None,
    live_rate_rps: float | None = None,
    json_path: Path | None,
) -> dict[str, object]:
    """Runs the named parts in order; writes their numbers to ``json_path`` when given."""
    # vLLM's start-up notes (Triton, CPU block size) would interleave with the progress lines.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    report: dict[str, object] = {}
    if "scripted" in parts:
        from meridian.demo import scripted

        report["scripted"] = scripted.run_part(seeds, cache_dir)
    if "replay" in parts:
        from meridian.demo import replay

        report["replay"] = replay.run_part(cache_dir)
    if "live" in parts:
        from meridian.demo import live

        report["live"] = live.run_part(model, cache_dir, live_requests, live_rate_rps)
    if "thinking" in parts:
        from meridian.demo import live, thinking

        report["thinking"] = thinking.run_part(model or live.DEFAULT_MODEL, cache_dir)
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {json_path}")
    return report
