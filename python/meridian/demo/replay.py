"""The replay part of ``meridian demo``: a window of the bundled Azure LLM 2023 excerpt with
production-derived reasoning lengths through every policy, in virtual time on the H200 /
32B-class profile (``meridian.replay``; the window and load are ``runner.DEMO_OPTIONS``).
Invariant: it runs the same replay as ``meridian replay`` without a trace, nothing of its own.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from meridian.replay.runner import DEMO_OPTIONS, render, run_replay


def run_part(cache_dir: Path) -> dict[str, object]:
    """Replays the demo's window and prints the table."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    print(
        "\nReplay: a bundled excerpt of the Azure LLM inference trace 2023 (Patel et al., Splitwise, ISCA '24; "
        "CC-BY-4.0), real arrivals + production-derived reasoning lengths (ServeGen DeepSeek-R1), on the "
        "H200 / 32B-class profile, every policy, virtual time.",
        flush=True,
    )
    started = time.monotonic()
    report = run_replay(DEMO_OPTIONS.with_cache_dir(cache_dir))
    print(render(report))
    print(f"(replayed in {time.monotonic() - started:.0f} s)", flush=True)
    return report.to_json()
