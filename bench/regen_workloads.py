"""The workload files taken out of git (bench/results/README.md, "Regenerable workloads"),
written again from their seeds: every live run's schedule is ``meridian.demo.loadgen.Workload``
(seeded Poisson arrivals, lengths and classes), so the file a run wrote is a function of its
request count, rate, seed, length family and model. The table below is each removed file's
arguments, as the run's script called it (``bench/live_ab.py``, ``bench/kv_tier.py``,
``bench/live_overload.py``, ``bench/fleet_ab.py``, ``bench/live_warm_start.py``, and
``measure_capacity_rps``'s ``capacity-burst.jsonl``: 480 requests of the family at 1,000/s, seed 1),
with the first 16 hex digits of the removed file's SHA-256.

Runs before the ``priority`` field (2026-12-01 to 2026-12-05, uniform family) wrote each request
without ``extra.priority``; ``strip`` drops it again, so the file comes back byte for byte.

    .venv/bin/python bench/regen_workloads.py [--check] [FOLDER ...]

``--check``: regenerate in memory and compare with the recorded hashes, writing nothing (exit 1 on
a mismatch). FOLDER: only the files under these ``bench/results/`` folders (default: all).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from meridian.demo.loadgen import LIVE_MODELS, Workload

RESULTS = Path(__file__).resolve().parent / "results"
#: (path under bench/results, model, requests, rate/s, seed, length family, strip priority, sha256[:16])
REMOVED = [
    ("fleet_ab_long_2026-12-06/capacity-burst.jsonl", "long", 480, 1000, 1, "servegen", False, "9a5747bacefb8c30"),
    ("kv_tier_tiny_2026-12-02/workload.jsonl", "tiny", 420, 14, 0, "uniform", True, "9f1eaa76c676f34f"),
    ("live_ab_compute_2026-12-01-fading-prior/workload.jsonl", "compute", 360, 12, 0, "uniform", True, "ae2df2ae3b312811"),
    ("live_ab_compute_2026-12-01/workload.jsonl", "compute", 360, 12, 0, "uniform", True, "ae2df2ae3b312811"),
    ("live_ab_compute_2026-12-02/workload.jsonl", "compute", 360, 12, 0, "uniform", True, "ae2df2ae3b312811"),
    ("live_ab_tiny_2026-12-01-default/workload.jsonl", "tiny", 420, 14, 0, "uniform", True, "9f1eaa76c676f34f"),
    ("live_ab_tiny_2026-12-01-fading-prior/workload.jsonl", "tiny", 420, 14, 0, "uniform", True, "9f1eaa76c676f34f"),
    ("live_ab_tiny_2026-12-01/workload.jsonl", "tiny", 420, 14, 0, "uniform", True, "9f1eaa76c676f34f"),
    ("live_ab_tiny_2026-12-02/workload.jsonl", "tiny", 420, 14, 0, "uniform", True, "9f1eaa76c676f34f"),
    ("live_ab_tiny_2026-12-03-contended/workload.jsonl", "tiny", 420, 14, 0, "uniform", True, "9f1eaa76c676f34f"),
    ("live_ab_tiny_2026-12-03-value-density/workload.jsonl", "tiny", 420, 14, 0, "uniform", True, "9f1eaa76c676f34f"),
    ("live_ab_tiny_2026-12-03/workload.jsonl", "tiny", 420, 14, 0, "uniform", True, "9f1eaa76c676f34f"),
    ("live_ab_tiny_2026-12-05-shed/workload.jsonl", "tiny", 640, 32, 0, "uniform", True, "08e6b6dfb34d4d65"),
    ("live_overload_benchmark_long_2026-12-06/capacity-burst.jsonl", "long", 480, 1000, 1, "benchmark", False, "9feeb21845bb4f15"),
    ("live_overload_servegen_long_2026-12-06/capacity-burst.jsonl", "long", 480, 1000, 1, "servegen", False, "9a5747bacefb8c30"),
    ("live_probe_priors_2026-12-01/matched/workload.jsonl", "tiny", 420, 14, 0, "uniform", True, "9f1eaa76c676f34f"),
    ("live_probe_priors_2026-12-01/noreserve/workload.jsonl", "tiny", 420, 14, 0, "uniform", True, "9f1eaa76c676f34f"),
    ("live_sweep_2026-12-01/compute_kv1024/workload-sweep-0.jsonl", "compute", 40, 0.5, 0, "uniform", True, "df12a92ea87998f6"),
    ("live_sweep_2026-12-01/compute_kv1024/workload-sweep-1.jsonl", "compute", 300, 8, 0, "uniform", True, "6b77c6883bb08421"),
    ("live_sweep_2026-12-01/compute_kv1024/workload-sweep-2.jsonl", "compute", 300, 10, 0, "uniform", True, "1ac3a7dc524a6a4b"),
    ("live_sweep_2026-12-01/compute_kv1024/workload-sweep-3.jsonl", "compute", 300, 12, 0, "uniform", True, "288d7150cd6217e1"),
    ("live_sweep_2026-12-01/compute_kv1024_worker_unpinned/workload-sweep-0.jsonl", "compute", 40, 0.5, 0, "uniform", True, "df12a92ea87998f6"),
    ("live_sweep_2026-12-01/compute_kv1024_worker_unpinned/workload-sweep-1.jsonl", "compute", 300, 6, 0, "uniform", True, "0d549bf7eb3de872"),
    ("live_sweep_2026-12-01/compute_kv512/workload-sweep-0.jsonl", "compute", 40, 0.5, 0, "uniform", True, "df12a92ea87998f6"),
    ("live_sweep_2026-12-01/compute_kv512/workload-sweep-1.jsonl", "compute", 300, 4, 0, "uniform", True, "845ab1d4f1767547"),
    ("live_sweep_2026-12-01/compute_kv512/workload-sweep-2.jsonl", "compute", 300, 6, 0, "uniform", True, "0d549bf7eb3de872"),
    ("live_sweep_2026-12-01/compute_kv512/workload-sweep-3.jsonl", "compute", 300, 8, 0, "uniform", True, "6b77c6883bb08421"),
    ("live_sweep_2026-12-01/compute_kv512_high/workload-sweep-0.jsonl", "compute", 40, 0.5, 0, "uniform", True, "df12a92ea87998f6"),
    ("live_sweep_2026-12-01/compute_kv512_high/workload-sweep-1.jsonl", "compute", 300, 12, 0, "uniform", True, "288d7150cd6217e1"),
    ("live_sweep_2026-12-01/compute_kv512_high/workload-sweep-2.jsonl", "compute", 300, 16, 0, "uniform", True, "04404775991793ba"),
    ("live_sweep_2026-12-01/tiny_kv320/workload-sweep-0.jsonl", "tiny", 40, 0.5, 0, "uniform", True, "df12a92ea87998f6"),
    ("live_sweep_2026-12-01/tiny_kv320/workload-sweep-1.jsonl", "tiny", 300, 10, 0, "uniform", True, "1ac3a7dc524a6a4b"),
    ("live_sweep_2026-12-01/tiny_kv320/workload-sweep-2.jsonl", "tiny", 300, 14, 0, "uniform", True, "d4a43958132676e4"),
    ("live_sweep_2026-12-01/tiny_kv512/workload-sweep-0.jsonl", "tiny", 40, 0.5, 0, "uniform", True, "df12a92ea87998f6"),
    ("live_sweep_2026-12-01/tiny_kv512/workload-sweep-1.jsonl", "tiny", 300, 12, 0, "uniform", True, "288d7150cd6217e1"),
    ("live_sweep_2026-12-01/tiny_kv512/workload-sweep-2.jsonl", "tiny", 300, 16, 0, "uniform", True, "04404775991793ba"),
    ("live_sweep_2026-12-01/tiny_kv512/workload-sweep-3.jsonl", "tiny", 300, 20, 0, "uniform", True, "e07e59c7f1186174"),
    ("live_sweep_tiny_2026-12-05/workload-sweep-0.jsonl", "tiny", 40, 2, 0, "uniform", True, "ce0bb8f61835d2eb"),
    ("live_sweep_tiny_2026-12-05/workload-sweep-1.jsonl", "tiny", 420, 14, 0, "uniform", True, "9f1eaa76c676f34f"),
    ("live_sweep_tiny_2026-12-05/workload-sweep-2.jsonl", "tiny", 420, 20, 0, "uniform", True, "dcf2c403593b27de"),
    ("live_sweep_tiny_2026-12-05/workload-sweep-3.jsonl", "tiny", 420, 26, 0, "uniform", True, "866f8eabb84eb0fc"),
    ("live_sweep_tiny_2026-12-05/workload-sweep-4.jsonl", "tiny", 420, 32, 0, "uniform", True, "c22366502a1358ff"),
    ("live_warm_start_servegen_long_2026-12-06/workload-preload.jsonl", "long", 3604, 40.05, 100, "servegen", False, "b1c62f3dd604d984"),
    ("live_warm_start_servegen_long_2026-12-06/workload-timed.jsonl", "long", 2403, 40.05, 7, "servegen", False, "afc605aa252a6ea0"),
]


def regenerate(model: str, requests: int, rate: float, seed: int, lengths: str, strip: bool) -> str:
    m = LIVE_MODELS[model]
    if lengths == "uniform":  # bench/live_ab.py and bench/kv_tier.py: the defaults
        workload = Workload(requests, rate, m.classes, seed=seed)
    else:
        workload = Workload(requests, rate, m.classes, seed=seed, lengths=lengths, max_think=m.max_think,
                            max_tokens=m.max_tokens)
    text = workload.jsonl()
    if not strip:
        return text
    out = []
    for line in text.splitlines():
        entry = json.loads(line)
        entry["extra"].pop("priority", None)
        out.append(json.dumps(entry) + "\n")
    return "".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", help="bench/results folders (default: every one in the table)")
    parser.add_argument("--check", action="store_true", help="compare with the recorded hashes, write nothing")
    args = parser.parse_args()
    wanted = {Path(f).name for f in args.folders}
    bad = 0
    for rel, model, requests, rate, seed, lengths, strip, sha in REMOVED:
        if wanted and rel.split("/")[0] not in wanted:
            continue
        text = regenerate(model, requests, rate, seed, lengths, strip)
        ok = hashlib.sha256(text.encode()).hexdigest().startswith(sha)
        bad += not ok
        if args.check:
            print(f"{'ok' if ok else 'MISMATCH'}  {rel}")
        else:
            (RESULTS / rel).write_text(text)
            print(f"wrote {rel}{'' if ok else '  (hash differs from the removed file)'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
