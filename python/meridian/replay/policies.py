"""The policies a replay compares, in one vocabulary, and how one is replayed.

A policy is stock vLLM (``vllm-fcfs``, ``vllm-priority``: vLLM's own ``AsyncScheduler`` under
that scheduling policy) or ``MeridianScheduler`` in one of the core's policy modes, named as the
config's ``policy`` key names them (``meridian``, ``answer_first``, ``pascal``, and the
published baselines ``uniboost`` and ``scorpio``). The demo's
scripted and live parts use the same names. Replaying one builds the scheduler the way
``EngineCore`` does, with the profile's KV capacity and batch limits, and runs it through the
offline engine loop with the profile's step time. Invariant: every policy replays through the
very same engine loop and observer; only the scheduler differs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meridian._core import Config
from meridian.offline.engine import EngineRun, EngineSpec, OfflineEngine, OfflineRequest, build_scheduler
from meridian.replay.profiles import Profile, StepBatch
from meridian.vllm.names import CONFIG_KEY, POLICY_NAMES


@dataclass(frozen=True)
class PolicySpec:
    """A scheduler to replay: stock vLLM or Meridian in one of its policy modes."""

    name: str
    description: str
    #: The core's ``policy`` mode; ``None``: vLLM's own ``AsyncScheduler``.
    meridian_policy: str | None
    #: vLLM's ``--scheduling-policy``.
    vllm_policy: str = "fcfs"


_MERIDIAN_DESCRIPTIONS = {
    "meridian": "Meridian: dual queue, slack, step budget, admission reserve, tiers",
    "answer_first": "ablation: answering first, FCFS otherwise, nothing else",
    "pascal": "reasoning first, answers paced at their TPOT target (PASCAL, arXiv 2602.11530)",
    "uniboost": "prediction-free γ-boost between FCFS and SJF, KV-aware victim (UniBoost, arXiv 2606.18431)",
    "scorpio": "least TTFT deadline first, unattainable last, TPOT-guarded batch size (SCORPIO, arXiv 2505.23022)",
}

POLICIES: dict[str, PolicySpec] = {
    p.name: p
    for p in (
        PolicySpec("vllm-fcfs", "stock vLLM AsyncScheduler, first come first served", None, "fcfs"),
        PolicySpec("vllm-priority", "stock vLLM AsyncScheduler, priority = SLO class rank", None, "priority"),
        *(PolicySpec(name, _MERIDIAN_DESCRIPTIONS[name], name) for name in POLICY_NAMES),
    )
}
#: The stock baseline and the product, the two the demo puts side by side.
STOCK, MERIDIAN = POLICIES["vllm-fcfs"], POLICIES["meridian"]


def policy_spec(name: str) -> PolicySpec:
    """The policy called ``name``, or a ``ValueError`` listing the known ones."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None


def scheduler_class(spec: PolicySpec) -> type[Any]:
    """The vLLM scheduler class a policy runs."""
    if spec.meridian_policy is None:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        return AsyncScheduler
    from meridian.vllm.scheduler import MeridianScheduler

    return MeridianScheduler


def additional_config(spec: PolicySpec, meridian_config: dict[str, Any], profile: Profile | None = None) -> dict[str, Any]:
    """vLLM's ``additional_config`` for a policy: the operator's ``meridian`` block with the
    policy mode, and the profile's step-time seed unless the operator gave one; nothing for stock
    vLLM."""
    if spec.meridian_policy is None:
        return {}
    config = dict(meridian_config)
    config["policy"] = spec.meridian_policy
    if profile is not None:
        config.setdefault("step_time", meridian_seed_step_time(profile))
    return {CONFIG_KEY: config}


def meridian_seed_step_time(profile: Profile) -> dict[str, float]:
    """The linear step-time seed Meridian's config takes, read off ``profile`` — what an operator
    who knows the hardware would configure (Meridian refits it online from the steps anyway)."""
    base_ms = profile.step_time_ms(StepBatch(0, 1, 0))
    num_tokens = profile.max_num_batched_tokens
    per_prefill_ms = (profile.step_time_ms(StepBatch(num_tokens, 0, num_tokens)) - base_ms) / num_tokens
    num_decodes = min(profile.max_num_seqs, 256)
    per_decode_ms = (profile.step_time_ms(StepBatch(0, num_decodes, 0)) - base_ms) / (num_decodes - 1 or 1)
    num_context = 1_000_000
    per_context_ms = (profile.step_time_ms(StepBatch(0, 1, num_context)) - base_ms) / num_context
    # Meridian's seed wants a positive prompt-token cost; a flat profile gets a negligible one.
    return {
        "base_ms": max(base_ms, 0.0),
        "per_prefill_token_ms": max(per_prefill_ms, 1e-9),
        "per_decode_request_ms": max(per_decode_ms, 0.0),
        "per_context_token_ms": max(per_context_ms, 0.0),
    }


def scheduler_config(meridian_config: dict[str, Any], spec: PolicySpec, profile: Profile) -> dict[str, Any]:
    """The ``meridian`` block a Meridian policy runs with: the operator's classes and knobs, the
    policy mode, and the profile's step-time seed unless the operator gave one."""
    config = dict(meridian_config)
    config["policy"] = spec.meridian_policy
    config.setdefault("step_time", meridian_seed_step_time(profile))
    return config


@dataclass(frozen=True)
class HostTier:
    """The host KV tier a replay models: vLLM's OffloadingConnector with this many blocks of host
    memory, loads priced at the profile's host link."""

    num_blocks: int
    load_ms_per_token: float

    @classmethod
    def of(cls, profile: Profile, host_gib: float) -> HostTier | None:
        """A tier of ``host_gib`` GiB of host memory on ``profile`` (None for 0)."""
        if host_gib <= 0:
            return None
        kv_bytes = getattr(profile.cost, "kv_bytes_per_token", None)
        load_ms_per_token = profile.host_load_ms_per_token()
        num_blocks = int(host_gib * 2**30 // (int(kv_bytes or 0) * profile.block_size))
        return cls(num_blocks=max(1, num_blocks), load_ms_per_token=load_ms_per_token)


def engine_spec(spec: PolicySpec, profile: Profile, meridian_config: dict[str, Any], model_dir: Path,
                host_tier: HostTier | None = None) -> EngineSpec:
    """The vLLM engine a policy is replayed on: the profile's KV capacity and batch limits, and
    the host tier if one is modelled."""
    return EngineSpec(
        model_dir=model_dir,
        num_blocks=profile.num_kv_blocks,
        block_size=profile.block_size,
        max_num_seqs=profile.max_num_seqs,
        max_num_batched_tokens=profile.max_num_batched_tokens,
        max_model_len=profile.max_model_len,
        policy=spec.vllm_policy,
        additional_config=additional_config(spec, meridian_config, profile),
        num_host_blocks=host_tier.num_blocks if host_tier is not None else 0,
        host_load_ms_per_token=host_tier.load_ms_per_token if host_tier is not None else 0.0,
    )


@dataclass
class ReplayResult:
    """One policy's replay."""

    policy: str
    run: EngineRun


def replay_engine(
    spec: PolicySpec,
    requests: Sequence[OfflineRequest],
    profile: Profile,
    *,
    meridian_config: dict[str, Any],
    model_dir: Path,
    progress: Callable[[int], None] | None = None,
    scheduler_cls: type[Any] | None = None,
    engine_cls: type[OfflineEngine] = OfflineEngine,
    batch_queue_size: int | None = None,
    host_tier: HostTier | None = None,
) -> OfflineEngine:
    """The engine that replays ``requests`` under one policy on ``profile``, ready to run.
    ``scheduler_cls`` replaces the policy's scheduler class (a subclass of it, say), and
    ``engine_cls`` the engine loop's class."""
    scheduler = build_scheduler(
        scheduler_cls or scheduler_class(spec), engine_spec(spec, profile, meridian_config, model_dir, host_tier)
    )
    return engine_cls(
        scheduler,
        requests,
        observer_config=Config.from_json(json.dumps(meridian_config)),
        step_time_ms=lambda shape: profile.step_time_ms(StepBatch(**shape)),
        batch_queue_size=batch_queue_size,
        keep_output_tokens=False,
        progress=progress,
        host_load_ms_per_token=host_tier.load_ms_per_token if host_tier is not None else 0.0,
    )


def replay_policy(spec: PolicySpec, requests: Sequence[OfflineRequest], profile: Profile, **options: Any) -> ReplayResult:
    """Replays ``requests`` under one policy on ``profile`` (``options``: ``replay_engine``'s)."""
    return ReplayResult(spec.name, replay_engine(spec, requests, profile, **options).run())
