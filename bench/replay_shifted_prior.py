"""Replay with a wrong prior: does Meridian still hold when the configured length priors are 10×
shorter, or 10× longer, than the traffic it serves?

The development workloads of ``bench/replay_ab.py`` at its load (the FCFS ~50 % point it found),
stock FCFS (which uses no prior) and Meridian with ``think_tokens_prior`` and
``answer_tokens_prior`` scaled by 0.1 and by 10, so the predictors start far from the truth and
must learn the server's own lengths (``predictor``: the prior counts as 10 pseudo-observations).
Targets (issue 11): throughput ≥ 0.99× FCFS and goodput ≥ FCFS's, over the whole run and from
the first minute (the requests that arrived in the first 60 s, served while the predictors still
hold little more than the wrong prior, meet their targets at least as often as under FCFS).
Virtual time: the numbers do not depend on this machine.

    .venv/bin/python bench/replay_shifted_prior.py [--workloads azure mooncake] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from development import HALF_LOAD, replay_variants, workloads, write_results  # noqa: E402
from meridian._core import Config  # noqa: E402
from meridian.replay.runner import default_meridian_config  # noqa: E402

SCALES = (0.1, 10.0)


def scaled_prior(scale: float) -> dict[str, object]:
    """The default config with both of the core's default priors scaled by ``scale``."""
    config = default_meridian_config()
    think, answer = Config.from_json(json.dumps(config)).length_priors
    return {**config,
            "think_tokens_prior": [max(1, round(v * scale)) for v in think],
            "answer_tokens_prior": [max(1, round(v * scale)) for v in answer]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    available = workloads(0)
    results: dict[str, object] = {}
    for name in args.workloads or list(available):
        started = time.monotonic()
        rows = replay_variants(name, {f"meridian, prior ×{scale:g}": scaled_prior(scale) for scale in SCALES})
        fcfs = rows["vllm-fcfs"]
        print(f"\n=== {name} at ×{HALF_LOAD[name]:.3g} ({time.monotonic() - started:.0f} s wall)")
        for label, s in rows.items():
            g, t = s["goodput_rps"] / fcfs["goodput_rps"], s["throughput_tok_s"] / fcfs["throughput_tok_s"]
            first, first_fcfs = s["first_minute"]["good"], fcfs["first_minute"]["good"]
            verdict = "" if label == "vllm-fcfs" else (
                f"  goodput {'met' if g >= 1.0 else 'MISSED'}, first minute "
                f"{'met' if first >= first_fcfs else 'MISSED'}, throughput {'met' if t >= 0.99 else 'MISSED'}")
            print(f"  {label:<22} goodput {s['goodput_rps']:.3f} ({g:.2f}× FCFS)  first-minute arrivals good "
                  f"{first}/{s['first_minute']['submitted']}  throughput {t:.3f}× FCFS"
                  f"  TTFAT p99 {s['ttfat_ms']['p99'] / 1e3:.0f} s{verdict}")
        results[name] = {"rate_scale": HALF_LOAD[name], "policies": rows}
    write_results(results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
