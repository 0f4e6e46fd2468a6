"""The scenario corpus (issue 23): every policy over many workloads built from the shared public
traces, at three loads each, with the geometric mean and the worst scenario per load and,
optionally, each policy's capacity (DistServe's goodput: the highest rate at which 80 % of the
requests meet every target). See ``meridian.replay.corpus`` for how scenarios are built. The
columns include vLLM's own load valve (``--max-num-queued-reqs``) in front of stock vLLM: at the
cap vLLM's docs advise (``vllm-fcfs+cap``, ``vllm-priority+cap``) and at the best cap of a grid,
searched per scenario and load (``vllm-fcfs+cap*``, an oracle: generous to the baseline); and
stock FCFS with vLLM 0.34's cache-aware admission (``vllm-fcfs+cache-aware``, its window sized
as vLLM's docs advise; only Mooncake's scenarios share prefixes, so on the Azure ones it is FCFS).

Results are cached under ``.cache/corpus/`` (keyed by everything that determines them, the core's
build included), so a rerun only replays what changed; ``--no-cache`` replays everything. Virtual
time: the numbers do not depend on this machine's speed.

    .venv/bin/python bench/corpus.py [--per-family 6] [--seed 0] [--capacity]
        [--loads 0.5] [--variant queue='{"on_overload": "queue"}' ...] [--out bench/results/corpus_<date>]
        [--loads-from bench/results/corpus_<date>/corpus.json]

``--loads-from`` takes the calibrated rates of an earlier report on the same scenarios (same
``--per-family`` and ``--seed``) instead of searching them again; the results are the same.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from meridian.replay.corpus import (  # noqa: E402
    LOAD_POINTS, Corpus, columns, leave_one_family_out, loads_of, make_corpus, plot, render, run_corpus,
)
from meridian.replay.noise import StepNoise  # noqa: E402
from meridian.replay.policies import CACHE_AWARE, TUNED_VALVE  # noqa: E402
from meridian.replay.report import write_json  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
#: The published baselines, vLLM's own load valve (docs-sized and tuned) and the product (the
#: ablations answer_first and pascal are left out: the corpus measures what an operator would
#: choose between).
DEFAULT_POLICIES = ("vllm-fcfs", "vllm-priority", "vllm-fcfs+cap", "vllm-priority+cap", TUNED_VALVE, CACHE_AWARE,
                    "uniboost", "scorpio", "meridian")


def variant(text: str) -> tuple[str, dict[str, object]]:
    label, _, body = text.partition("=")
    value = json.loads(body) if body else {}
    if not label or not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected LABEL=JSON-object, got {text!r}")
    return label, value


def load_points(text: str) -> tuple[float, ...]:
    try:
        points = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated load points such as 0.9,0.5, got {text!r}") from None
    if not all(p in LOAD_POINTS for p in points):
        raise argparse.ArgumentTypeError(f"load points {text!r}: each must be one of {', '.join(map(str, LOAD_POINTS))}")
    return points


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-family", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--families", nargs="+", default=None)
    parser.add_argument("--scenarios", nargs="+", default=None,
                        help="replay only these scenarios of the corpus (names as in its report, e.g. azure-conv-00)")
    parser.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    parser.add_argument("--variant", type=variant, action="append", default=[],
                        help="a Meridian variant LABEL=JSON (its `meridian` keys; on_overload sets every class's)")
    parser.add_argument("--capacity", action="store_true", help="also search each column's capacity")
    parser.add_argument("--loads", type=load_points, default=None,
                        help="comma-separated load points to replay (FCFS's attainment there: 0.9, 0.7, 0.5; default all)")
    parser.add_argument("--loads-from", type=Path, default=None,
                        help="an earlier corpus.json on the same scenarios: its calibrated rates, no new search")
    parser.add_argument("--lofo", default=None,
                        help="comma-separated column labels to pick a default from, leave-one-family-out")
    parser.add_argument("--step-noise", type=Path, default=None,
                        help="a step-noise model (meridian fit-profile --noise-out): every replay's steps meet it "
                             "(with --loads-from, at the noiseless calibration's rates)")
    parser.add_argument("--noise-seed", type=int, default=0, help="the step noise's seed (default 0)")
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / f"corpus_{dt.date.today()}")
    args = parser.parse_args()

    started = time.monotonic()
    noise = StepNoise.load(args.step_noise, seed=args.noise_seed) if args.step_noise is not None else None
    corpus = Corpus(cache_dir=REPO / ".cache", jobs=args.jobs, use_cache=not args.no_cache, step_noise=noise,
                    progress=lambda line: print(f"[{time.monotonic() - started:7.0f} s] {line}", file=sys.stderr, flush=True))
    families = args.families or None
    scenarios = make_corpus(args.per_family, seed=args.seed, **({"families": families} if families else {}))
    if args.scenarios:
        unknown = sorted(set(args.scenarios) - {s.name for s in scenarios})
        if unknown:
            parser.error(f"--scenarios: no scenario {', '.join(unknown)} in this corpus "
                         f"(it has {', '.join(s.name for s in scenarios)})")
        scenarios = [s for s in scenarios if s.name in args.scenarios]
    cols = columns([p.strip() for p in args.policies.split(",") if p.strip()], dict(args.variant))
    points = {"points": args.loads} if args.loads else {}
    known = loads_of(args.loads_from) if args.loads_from else None
    report = run_corpus(corpus, scenarios, cols, capacity=args.capacity, known_loads=known, **points)
    text = ["# Scenario corpus", "", f"{len(scenarios)} scenarios (seed {args.seed}):", ""]
    if noise is not None:
        text[2:2] = [f"Step-time noise: {noise.to_json()} (seed {noise.seed})", ""]
    text += [f"- `{s.name}`: {s.describe()}, {s.num_requests} requests" for s in scenarios]
    text += ["", render(report)]
    payload = report.to_json()
    payload["step_noise"] = None if noise is None else {**noise.to_json(), "seed": noise.seed}
    if args.lofo:
        candidates = [c.strip() for c in args.lofo.split(",")]
        rows = leave_one_family_out(report, candidates, default="meridian")
        payload["leave_one_family_out"] = rows
        text += ["### Leave one family out (FCFS-50 % point)", "",
                 "| held out | picked on the others | its geo. mean there | on the held-out family | default there |",
                 "|---|---|---|---|---|"]
        text += [f"| {r['held_out']} | {r['picked']} | {r['picked_on_tuned']:.2f} | {r['picked_on_held_out']:.2f} | "
                 f"{r['default_on_held_out']:.2f} |" for r in rows]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text("\n".join(text) + "\n", encoding="utf-8")
    write_json(args.out / "corpus.json", payload)
    plot(report, args.out)
    print("\n".join(text))
    print(f"wrote {args.out} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
