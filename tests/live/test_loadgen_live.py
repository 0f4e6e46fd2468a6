"""Live: a short live A/B — aiperf (the real load generator, ``make bench-live-setup``) replays a
seeded three-class reasoning workload open-loop against ``vllm serve`` (CPU build, tiny model)
with the stock scheduler and with ``MeridianScheduler`` (late requests queued, not shed): no request
fails or comes back empty under either, and greedy outputs are identical prompt by prompt."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from meridian.demo.loadgen import LIVE_MODELS, RoundSettings, Workload, find_aiperf, outputs_by_prompt, run_round

from tiny_server import QUEUE_LATE

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
NUM_REQUESTS = 60


def test_both_schedulers_serve_every_request_of_an_open_loop_load(cache_dir: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "60")
    model = LIVE_MODELS["tiny"]
    settings = RoundSettings(model=model, repo=REPO, cache_dir=cache_dir, aiperf=find_aiperf(REPO),
                             pin=len(os.sched_getaffinity(0)) >= 2, cooldown_s=1.0, warmup=2, timeout_s=300.0, raw=True,
                             meridian_config=QUEUE_LATE)
    dataset = tmp_path / "workload.jsonl"
    dataset.write_text(Workload(NUM_REQUESTS, 8.0, model.classes).jsonl())
    records = []
    for policy in ("stock", "meridian"):
        row, recs = run_round(policy, policy, dataset, tmp_path, settings)
        assert row["requests"] == NUM_REQUESTS, row
        assert (row["errors"], row["failed_in_records"], row["empty_responses"]) == (0, 0, 0), row["error_kinds"]
        assert len(recs) == NUM_REQUESTS and all(r.ttfo_ms is not None for r in recs)
        records += recs
    assert row["meridian_cost"] is not None and row["meridian_cost"]["num_steps"] > 0
    outputs = outputs_by_prompt(records)
    assert all(len(texts) == 1 for texts in outputs.values()), {p: t for p, t in outputs.items() if len(t) > 1}
