"""vLLM 0.34's cache-aware admission as a replay baseline (``meridian.replay.cache_aware``).

On every vLLM: the settings are checked and named, the policy names parse, a workload without
shared prefixes replays exactly as FCFS, and one with them does not. On vLLM 0.34 (``make
test-vllm034``): the port and vLLM's own code, replayed on the same prefix-sharing workload,
admit the same requests at the same steps and produce the same outputs at the same times —
under stock FCFS and under Meridian's scheduler, with the KV cache tight enough to preempt and
loose enough that the seats bind (the two paths into the port's reorder)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

from meridian._core import Config
from meridian.replay.cache_aware import CacheAwareAdmission, check_threshold, check_window
from meridian.replay.policies import (
    CACHE_AWARE,
    POLICIES,
    ReplayResult,
    cache_aware_window_for,
    docs_sized_cache_aware_window,
    policy_spec,
    replay_engine,
    shared_first_blocks,
    with_sized_window,
)
from meridian.replay.traces import TraceRequest
from replay_profiles import linear_profile

pytestmark = pytest.mark.vllm

CONFIG: dict[str, Any] = {
    "classes": {"standard": {"ttft_ms": 2000.0, "ttfat_ms": 20000.0, "answer_tpot_ms": 100.0, "rank": 1}},
    "default_class": "standard",
    "priority_map": {"0": "standard"},
}


# ---- settings and names (no vLLM needed beyond the imports) ------------------------------------


@pytest.mark.parametrize("window", [-1, 1.5, "8", True, None])
def test_a_bad_window_is_named(window: object) -> None:
    with pytest.raises(ValueError, match=rf"window {window!r}: .*--cache-aware-admission-window"):
        check_window(window)


@pytest.mark.parametrize("threshold", [-0.1, 1.01, float("nan"), float("inf"), "0.5", False])
def test_a_bad_threshold_is_named(threshold: object) -> None:
    with pytest.raises(ValueError, match=r"threshold .*: expected a KV cache usage between 0 and 1"):
        check_threshold(threshold)


def test_the_settings_take_what_vllm_takes() -> None:
    assert CacheAwareAdmission(0).threshold == 0.5  # vLLM's defaults: window off, threshold 0.5
    assert CacheAwareAdmission(64, 0).threshold == 0.0
    assert CacheAwareAdmission(1, 1).threshold == 1.0


def test_policy_names() -> None:
    assert CACHE_AWARE in POLICIES and POLICIES[CACHE_AWARE].cache_aware_window is None
    spec = policy_spec(f"{CACHE_AWARE}=64")
    assert (spec.name, spec.cache_aware_window, spec.cache_aware_threshold) == (f"{CACHE_AWARE}=64", 64, 0.5)
    spec = policy_spec(f"{CACHE_AWARE}=16:0.25")
    assert (spec.name, spec.cache_aware_window, spec.cache_aware_threshold) == (f"{CACHE_AWARE}=16:0.25", 16, 0.25)
    assert policy_spec(f"{CACHE_AWARE}=16:0.5").name == f"{CACHE_AWARE}=16"


@pytest.mark.parametrize(
    ("name", "named"),
    [
        (f"{CACHE_AWARE}=-4", "window -4"),
        (f"{CACHE_AWARE}=big", "window 'big'"),
        (f"{CACHE_AWARE}=8:2", "threshold 2.0"),
        (f"{CACHE_AWARE}=8:-0.5", "threshold -0.5"),
        (f"{CACHE_AWARE}=8:half", "threshold 'half'"),
    ],
)
def test_a_bad_policy_name_names_the_value(name: str, named: str) -> None:
    with pytest.raises(ValueError, match=rf"policy '{re.escape(name)}': .*{re.escape(named)}"):
        policy_spec(name)


def test_the_docs_sized_window() -> None:
    # The queue that drains within the tightest TTFT target, at least two requests.
    assert docs_sized_cache_aware_window(capacity_rps=3.2, min_ttft_target_ms=2000.0) == 7
    assert docs_sized_cache_aware_window(capacity_rps=0.1, min_ttft_target_ms=1000.0) == 2
    with pytest.raises(ValueError, match="capacity"):
        docs_sized_cache_aware_window(capacity_rps=0.0, min_ttft_target_ms=1000.0)


# ---- replays ------------------------------------------------------------------------------------

def shared_prefix_requests(n: int = 300, seed: int = 0, shared: bool = True) -> list[TraceRequest]:
    """Requests in six prefix groups (each prompt: its group's blocks, then one of its own),
    Poisson arrivals every 40 ms on average; ``shared=False``: every prompt its own."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(1 / 40.0)
        group, blocks = rng.randrange(6), rng.choice([4, 6, 8])
        think, answer = rng.randrange(10, 60), rng.randrange(5, 30)
        hashes = (
            tuple([group * 1000 + b for b in range(blocks - 1)] + [10**6 + i])
            if shared
            else tuple(10**6 + i * 100 + b for b in range(blocks))
        )
        out.append(
            TraceRequest(
                req_id=f"r{i}", arrival_ms=t, num_prompt_tokens=32 * blocks, num_output_tokens=think + answer,
                num_think_tokens=think, num_answer_tokens=answer, prefix_block_hashes=hashes, hash_block_size=32,
            )
        )
    return out


def profile(num_kv_blocks: int) -> Any:

    return linear_profile(
        "test-cache-aware", "tiny", num_kv_blocks=num_kv_blocks, max_num_seqs=16, max_num_batched_tokens=256,
        max_model_len=512, per_prefill_token_ms=0.05, per_decode_request_ms=0.5,
    )


class Replayed:
    """One replay's admissions (request ids per step), every request's token times and finish,
    and the scheduler it ran."""

    def __init__(self, admitted: list[list[str]], result: ReplayResult, scheduler: Any) -> None:
        self.admitted = admitted
        self.result = result
        self.scheduler = scheduler
        self.timelines = {
            req_id: (list(t.token_times_ms), t.finish_reason, t.stop_reason) for req_id, t in result.run.timelines.items()
        }


def replay(
    tmp_path: Path, policy: str, scheduler_cls: type[Any] | None, *, num_kv_blocks: int = 160, shared: bool = True,
    config: dict[str, Any] | None = None,
) -> Replayed:
    from meridian.replay.workload import model_dir_for, offline_requests

    config = config or CONFIG
    prof = profile(num_kv_blocks)
    requests = offline_requests(shared_prefix_requests(shared=shared), prof, Config.from_json(json.dumps(config)))
    spec = policy_spec(policy)
    admitted: list[list[str]] = []
    base = scheduler_cls
    if base is None:
        from meridian.replay.policies import scheduler_class

        base = scheduler_class(spec, cache_aware_window_for(spec, requests, prof, config))

    class Recording(base):  # type: ignore[misc,valid-type]
        def schedule(self, *args: Any, **kwargs: Any) -> Any:
            output = super().schedule(*args, **kwargs)
            admitted.append([r.req_id for r in output.scheduled_new_reqs])
            return output

    engine = replay_engine(spec, requests, prof, meridian_config=config, model_dir=model_dir_for(prof, tmp_path),
                           scheduler_cls=Recording)
    return Replayed(admitted, ReplayResult(policy, engine.run()), engine.scheduler)


def test_without_shared_prefixes_it_is_fcfs(tmp_path: Path) -> None:
    fcfs = replay(tmp_path, "vllm-fcfs", None, shared=False)
    aware = replay(tmp_path, f"{CACHE_AWARE}=64:0", None, shared=False)
    assert aware.admitted == fcfs.admitted
    assert aware.timelines == fcfs.timelines


def test_with_shared_prefixes_it_moves_cached_requests_first(tmp_path: Path) -> None:
    from meridian.replay.report import summarize

    fcfs = replay(tmp_path, "vllm-fcfs", None)
    aware = replay(tmp_path, f"{CACHE_AWARE}=64", None)
    assert aware.admitted != fcfs.admitted
    hits = summarize(aware.result)["prefix_cache"]["hits"]
    assert hits > summarize(fcfs.result)["prefix_cache"]["hits"]


def test_a_window_sized_for_the_workload(tmp_path: Path) -> None:
    from meridian.replay.workload import offline_requests

    prof = profile(160)
    requests = offline_requests(shared_prefix_requests(), prof, Config.from_json(json.dumps(CONFIG)))
    spec = policy_spec(CACHE_AWARE)
    window = cache_aware_window_for(spec, requests, prof, CONFIG)
    assert isinstance(window, int) and window >= 2
    assert with_sized_window(spec, requests, prof, CONFIG).cache_aware_window == window
    assert with_sized_window(spec, requests, prof, CONFIG).name == CACHE_AWARE
    with pytest.raises(ValueError, match="give the window"):
        cache_aware_window_for(spec, [], prof, CONFIG)
    assert shared_first_blocks(requests, prof.block_size) == len(requests)  # every group has several members
    unshared = offline_requests(shared_prefix_requests(shared=False), prof, Config.from_json(json.dumps(CONFIG)))
    assert shared_first_blocks(unshared, prof.block_size) == 0


# ---- the proof: the port against vLLM 0.34's own code -------------------------------------------


def _native_or_skip() -> None:
    from meridian.replay.cache_aware import native

    if not native():
        import vllm

        pytest.skip(f"vLLM {vllm.__version__} has no cache-aware admission of its own (0.34+: make test-vllm034)")


@pytest.mark.parametrize(
    ("window", "threshold", "num_kv_blocks"),
    [
        (8, 0.5, 160),  # seats bind: 0.34's waiting loop often never looks at the queue (the late path)
        (64, 0.5, 60),  # KV binds: preemptions in the running loop skip the reorder
        (4, 0.0, 60),  # every step
    ],
)
def test_the_port_replays_as_vllm_034_does(tmp_path: Path, window: int, threshold: float, num_kv_blocks: int) -> None:
    _native_or_skip()
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from meridian.replay.cache_aware import cache_aware_scheduler
    from meridian.replay.report import summarize

    port = replay(tmp_path, "vllm-fcfs", cache_aware_scheduler(AsyncScheduler, window, threshold, mode="port"),
                  num_kv_blocks=num_kv_blocks)
    ours = replay(tmp_path, "vllm-fcfs", cache_aware_scheduler(AsyncScheduler, window, threshold, mode="fields"),
                  num_kv_blocks=num_kv_blocks)
    # vLLM's own, as EngineCore builds it from --cache-aware-admission-*: the fields are set.
    assert ours.scheduler.cache_aware_window == window and ours.scheduler.cache_aware_threshold == threshold
    assert port.scheduler.cache_aware_window == 0  # the port leaves vLLM's own off
    assert port.admitted == ours.admitted
    # Setting the window after __init__ (how the composition with Meridian is measured) is what
    # the fields do.
    after = replay(tmp_path, "vllm-fcfs", cache_aware_scheduler(AsyncScheduler, window, threshold, mode="after-init"),
                   num_kv_blocks=num_kv_blocks)
    assert after.admitted == ours.admitted and after.timelines == ours.timelines
    assert port.timelines == ours.timelines
    assert summarize(port.result)["prefix_cache"] == summarize(ours.result)["prefix_cache"]
    # The workload exercised the reorder, and the port's one known difference never arose.
    assert port.scheduler.cache_aware_reorders > 0
    assert port.scheduler.cache_aware_kv_holding_steps == 0
    assert port.admitted != replay(tmp_path, "vllm-fcfs", None, num_kv_blocks=num_kv_blocks).admitted
    if num_kv_blocks == 60:
        assert sum(summarize(port.result)["preemptions"].values()) > 0


def test_the_port_composes_with_meridian_as_vllm_034_does(tmp_path: Path) -> None:
    """vLLM's reorder runs inside ``super().schedule()`` on the order Meridian's plan gave the
    queue; the port, armed right before vLLM's ``schedule()``, reorders the same queue at the same
    point."""
    _native_or_skip()
    from meridian.replay.cache_aware import cache_aware_scheduler
    from meridian.vllm.scheduler import MeridianScheduler

    port = replay(tmp_path, "meridian", cache_aware_scheduler(MeridianScheduler, 8, 0.0, mode="port"),
                  num_kv_blocks=60)
    # MeridianScheduler refuses the two fields at start-up: vLLM's reorder, its window set after
    # __init__ as vLLM's __init__ would set it (what the flags would do if let through).
    ours = replay(tmp_path, "meridian", cache_aware_scheduler(MeridianScheduler, 8, 0.0, mode="after-init"),
                  num_kv_blocks=60)
    assert ours.scheduler.cache_aware_window == 8
    assert port.admitted == ours.admitted
    assert port.timelines == ours.timelines
    assert port.scheduler.cache_aware_reorders > 0
    assert port.admitted != replay(tmp_path, "meridian", None, num_kv_blocks=60).admitted


def test_vllm_keeps_the_window_only_under_fcfs(tmp_path: Path) -> None:
    """As 0.34's ``__init__``: the priority policy has no positions to reorder by; the port
    follows it on every version."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from meridian.offline.engine import EngineSpec, build_scheduler
    from meridian.replay.cache_aware import cache_aware_scheduler, native
    from meridian.replay.workload import model_dir_for

    prof = profile(160)
    spec = EngineSpec(model_dir=model_dir_for(prof, tmp_path), num_blocks=160, max_model_len=512, policy="priority")
    port = build_scheduler(cache_aware_scheduler(AsyncScheduler, 8, mode="port"), spec)
    assert port._cache_aware_window_port == 0
    if native():
        for mode in ("fields", "after-init"):
            assert build_scheduler(cache_aware_scheduler(AsyncScheduler, 8, mode=mode), spec).cache_aware_window == 0


def test_a_bad_mode_is_named() -> None:
    from meridian.replay.cache_aware import cache_aware_scheduler

    with pytest.raises(ValueError, match="mode 'native'"):
        cache_aware_scheduler(object, 8, mode="native")
