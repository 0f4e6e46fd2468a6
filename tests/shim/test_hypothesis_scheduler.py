"""Random arrival/length mixes through stock vLLM and MeridianScheduler keep the invariants:
same tokens as scripted, every request finishes, no KV block leaks, and Meridian never preempts
an answering request while a thinking one runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meridian.offline.engine import EngineSpec, OfflineEngine, OfflineRequest, build_scheduler, scripted_request
from meridian.offline.tiny import WORD_IDS, reasoning_script

pytestmark = pytest.mark.vllm

BLOCK_SIZE = 16


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[OfflineRequest], int, int]:
    n = draw(st.integers(1, 12))
    requests = []
    largest = 0
    for i in range(n):
        prompt_len = draw(st.integers(1, 48))
        think = draw(st.integers(0, 48))
        answer = draw(st.integers(0, 24))
        tool_call = draw(st.booleans()) and answer > 0
        script = reasoning_script(think, answer, seed=i, tool_call=tool_call)
        largest = max(largest, prompt_len + len(script))
        requests.append(
            scripted_request(
                f"r{i}",
                float(draw(st.integers(0, 30))),
                [WORD_IDS[(i + j) % len(WORD_IDS)] for j in range(prompt_len)],
                script,
                priority=draw(st.sampled_from([-1, 0, 0, 1])),
            )
        )
    # At least room for the largest request (with a decode step of slack), at most a roomy cache.
    min_blocks = (largest + 1) // BLOCK_SIZE + 3
    num_blocks = draw(st.integers(min_blocks, min_blocks + 40))
    max_num_seqs = draw(st.integers(1, 8))
    return requests, num_blocks, max_num_seqs


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=workloads(), async_scheduling=st.booleans())
def test_random_workloads_keep_the_invariants(
    tiny_model: Path, workload: tuple[list[OfflineRequest], int, int], async_scheduling: bool
) -> None:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from meridian.vllm import MeridianScheduler

    requests, num_blocks, max_num_seqs = workload
    stock_cls: type[Any] = AsyncScheduler if async_scheduling else Scheduler
    for cls in (stock_cls, MeridianScheduler):
        spec = EngineSpec(
            model_dir=tiny_model,
            num_blocks=num_blocks,
            block_size=BLOCK_SIZE,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=64,
            async_scheduling=async_scheduling,
        )
        scheduler = build_scheduler(cls, spec)
        result = OfflineEngine(scheduler, requests, max_steps=20_000).run()
        for r in requests:
            got = result.timelines[r.req_id]
            assert got.output_token_ids == list(r.script.tokens), (cls.__name__, r.req_id)  # type: ignore[attr-defined]
            assert got.finish_reason == "stop"
        assert result.final_num_free_blocks == result.max_num_free_blocks, "KV blocks leaked"
        assert not scheduler.requests and not scheduler.running and len(scheduler.waiting) == 0
        if cls is MeridianScheduler:
            assert result.num_answer_preemption_alarms == 0
            assert scheduler.meridian.num_requests == 0
            assert scheduler.meridian.stats()["num_answer_preemption_alarms"] == 0
