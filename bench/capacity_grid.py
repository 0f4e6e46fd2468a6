"""Capacity check on a grid (results: bench/results/capacity_grid_2026-12-04/): FCFS's
80%-attainment rate interpolated from the saved 0.9/0.7 load points (and probed), then each
policy probed at multiples of it; per scenario the highest multiple at which the policy still
meets every target for >= 80% of requests. Rates from
bench/results/corpus_2026-12-03-final/corpus.json; replays cached under .cache/.

    .venv/bin/python bench/capacity_grid.py azure-code-03,azure-conv-05,mooncake-02 OUT.json
"""
import json, sys, time
from pathlib import Path
import numpy as np
from meridian.replay.corpus import Corpus, columns, make_corpus
REPO = Path(__file__).resolve().parent.parent
MULTS = [1.3, 1.45]
saved = json.load(open(REPO / "bench/results/corpus_2026-12-03-final/corpus.json"))["loads"]
names = sys.argv[1].split(",")
scen = [s for s in make_corpus(6, seed=0) if s.name in names]
def r80(name):
    a, b = saved[name]["0.9"], saved[name]["0.7"]
    (r1, f1), (r2, f2) = (a["rate"], a["fcfs_attainment"]), (b["rate"], b["fcfs_attainment"])
    return r1 + (0.8 - f1) * (r2 - r1) / (f2 - f1)
cols = columns(["scorpio", "meridian"])
jobs, keys = [], []
for s in scen:
    base = r80(s.name)
    for c in cols:
        for m in ([1.0, 1.1] if c.label == "vllm-fcfs" else MULTS):
            jobs.append(c.job(s, base * m)); keys.append((s.name, c.label, m))
t0 = time.monotonic()
res = Corpus(cache_dir=REPO / ".cache", jobs=2, use_cache=True, progress=lambda l: print(l, file=sys.stderr, flush=True)).run(jobs)
A = {k: r["attainment"] for k, r in zip(keys, res)}
print(f"{len(jobs)} replays in {time.monotonic()-t0:.0f} s")
out = {}
for s in scen:
    row = {}
    for c in cols:
        ms = sorted(m for (n, l, m) in A if n == s.name and l == c.label)
        row[c.label] = {"attainment": {m: A[(s.name, c.label, m)] for m in ms},
                        "capacity_x_r80": max([m for m in ms if A[(s.name, c.label, m)] >= 0.8], default=0.0)}
    out[s.name] = {"fcfs_r80_rps": r80(s.name), **row}
    print(s.name, f"r80={r80(s.name):.3f}", {l: (v["capacity_x_r80"], {m: round(a, 3) for m, a in v["attainment"].items()}) for l, v in row.items()})
json.dump(out, open(sys.argv[2], "w"), indent=1)
