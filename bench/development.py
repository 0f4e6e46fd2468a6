"""The development workloads every replay bench shares (``bench/replay_ab.py`` documents them):
the Azure LLM 2023 and Mooncake windows with their classes and profiles, the FCFS ~50 % load of
each, the side-by-side replay of config variants there, and the results writer. A module the
bench scripts import (each runs with ``bench/`` as its first import path), not a script.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from meridian.replay.runner import DEFAULT_TRACES, ReplayOptions, run_replay

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "traces"


#: The FCFS ~50 % load of each workload as `fcfs_load_at(workload, 0.5)` found it (deterministic: the other
#: bench scripts replay there without searching again).
HALF_LOAD = {"azure": 0.06099050286617136, "mooncake": 0.41843276745728586}


@dataclass(frozen=True)
class Workload:
    name: str
    options: ReplayOptions
    scales: tuple[float, ...]  # FCFS probe grid


def workloads(seed: int) -> dict[str, Workload]:
    azure = tuple(SHARED / "azure_llm_2023" / f"AzureLLMInferenceTrace_{k}.csv" for k in ("code", "conv"))
    have_azure = all(p.exists() for p in azure)
    mooncake = SHARED / "mooncake" / "synthetic_trace.jsonl"
    base = dict(seed=seed, progress=False, cache_dir=REPO / ".cache")
    out = {
        "azure": Workload(
            "azure",
            ReplayOptions(
                traces=azure if have_azure else DEFAULT_TRACES,
                classes="by-source:code=interactive,conv=standard",
                start_s=600.0 if have_azure else 0.0,
                duration_s=120.0,
                profile="h200-qwen3-32b",
                **base,
            ),
            (0.04, 0.055, 0.075, 0.1),
        ),
    }
    if mooncake.exists():
        out["mooncake"] = Workload(
            "mooncake",
            ReplayOptions(
                traces=(mooncake,),
                classes="mix:interactive=0.3,standard=0.7",
                start_s=120.0,
                duration_s=150.0,
                profile="h200-qwen3-8b",
                **base,
            ),
            (0.25, 0.4, 0.6, 0.9),
        )
    return out


def replay_variants(name: str, variants: dict[str, dict[str, object]]) -> dict[str, dict]:
    """Stock FCFS and Meridian under each of ``variants`` (label → its ``meridian`` config) on
    workload ``name`` at its ``HALF_LOAD``: the side-by-side rows of the sweep benches."""
    options = replace(workloads(0)[name].options, rate_scales=(HALF_LOAD[name],))
    rows = {"vllm-fcfs": run_replay(replace(options, policies=("vllm-fcfs",))).runs[0].summary}
    for label, config in variants.items():
        rows[label] = run_replay(replace(options, policies=("meridian",), meridian_config=config)).runs[0].summary
    return rows


def write_results(results: dict[str, object], path: Path | None) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {path}")
