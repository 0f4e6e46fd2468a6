"""vLLM's scheduler knobs under Meridian: every field of vLLM's ``SchedulerConfig``, in each supported
release, is either honoured — vLLM's own code keeps doing what the flag says with Meridian steering
it, or Meridian reads the value and plans within it — or refused at start-up, with an error that
names the flag and says why, for the values Meridian cannot honour.

``MeridianScheduler`` calls ``check_scheduler_config`` first thing, so a refused flag stops the
engine before it serves anything. ``tests/shim/test_scheduler_knobs.py`` enumerates the installed
vLLM's fields against ``KNOBS`` and holds each honoured one to a test of it and each refusal to its
message; a field a new vLLM release adds fails there until someone decides its row. Invariant: one
row per field name of every supported release, each with a stance; a refusal never depends on
anything but the field's own value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from meridian.errors import ConfigError


class Stance(Enum):
    """What Meridian does with a knob."""

    #: vLLM's own code applies it under Meridian, or Meridian plans within it.
    HONOURED = "honoured"
    #: Honoured for some values, refused at start-up for the others (``Knob.refused``).
    REFUSED_FOR_SOME = "refused for some values"
    #: Not an operator's flag: vLLM derives it (from the model, or from other flags).
    DERIVED = "derived by vLLM"


@dataclass(frozen=True)
class Knob:
    """One field of vLLM's ``SchedulerConfig``."""

    field: str
    stance: Stance
    #: How it works under Meridian (honoured values), for the docs and the operator.
    how: str
    #: The values refused, as a test on the field's value (``REFUSED_FOR_SOME`` only).
    refused: Callable[[Any], bool] | None = None
    #: Why those values are refused: the error's reason.
    why: str = ""

    @property
    def flag(self) -> str:
        """The ``vllm serve`` flag that sets the field."""
        return "--" + self.field.replace("_", "-")


def _honoured(field: str, how: str) -> Knob:
    return Knob(field, Stance.HONOURED, how)


def _refused(field: str, how: str, refused: Callable[[Any], bool], why: str) -> Knob:
    return Knob(field, Stance.REFUSED_FOR_SOME, how, refused, why)


def _derived(field: str, how: str) -> Knob:
    return Knob(field, Stance.DERIVED, how)


_ROWS = (
    _refused(
        "runner_type",
        "`generate`: Meridian schedules generation",
        lambda value: value != "generate",
        "Meridian schedules generating models; a pooling or draft runner generates no tokens to schedule",
    ),
    _honoured("max_num_batched_tokens", "the step's token budget never exceeds it (the core's limit)"),
    _honoured("max_num_scheduled_tokens", "the core's budget limit when set (vLLM's own per-step ceiling)"),
    _honoured("max_num_seqs", "the running seats the core admits into (with `max_num_active_seqs`, the lower)"),
    _honoured("max_num_active_seqs", "the running seats the core admits into, where lower than `max_num_seqs`"),
    _honoured(
        "max_num_inflight_kv_loads",
        "vLLM 0.34: the async KV-load queue is planned with the waiting queue in Meridian's order; its "
        "loads start without a seat within the cap and the answer KV reserve",
    ),
    _honoured("long_prefill_token_threshold", "vLLM caps each prompt chunk within the budget Meridian gives the step"),
    _honoured("long_prefill_token_threshold_adaptive", "as `long_prefill_token_threshold`, inside vLLM's step"),
    _honoured("max_num_queued_reqs", "enforced by vLLM's API server before a request reaches the scheduler (HTTP 503)"),
    _honoured(
        "max_num_queued_tokens", "enforced by vLLM's API server before a request reaches the scheduler (HTTP 503)"
    ),
    _refused(
        "enable_chunked_prefill",
        "on: Meridian's step budget splits prompts into chunks",
        lambda value: value is False,
        "Meridian's step budget keeps answering requests within their TPOT target by computing prompts in "
        "chunks; without chunked prefill a prompt longer than the step's budget would wait until nothing "
        "answers (vLLM turns it off itself for MLA models on CPU and for encoder-decoder models)",
    ),
    _derived("is_multimodal_model", "set from the model; vLLM's encoder budget applies to what Meridian admits"),
    _derived("max_num_encoder_input_tokens", "vLLM's encoder budget, inside its step"),
    _derived("encoder_cache_size", "vLLM's encoder cache, inside its step"),
    _honoured(
        "policy",
        "`priority` maps vLLM priorities onto SLO classes (`priority_map`); vLLM's queues run FCFS underneath "
        "Meridian's order",
    ),
    _honoured("disable_chunked_mm_input", "vLLM keeps a multimodal item whole within the budget Meridian gives"),
    _honoured("scheduler_cls", "`meridian.vllm.MeridianScheduler`"),
    _honoured(
        "disable_hybrid_kv_cache_manager",
        "either way: the core counts the block pool's free blocks, which vLLM shares between the groups",
    ),
    _honoured("scheduler_reserve_full_isl", "vLLM's own KV check on each request Meridian's allowance lets through"),
    _honoured("watermark", "vLLM keeps that share of blocks free on top of Meridian's answer KV reserve"),
    _honoured(
        "prefill_schedule_interval",
        "vLLM defers prompts on the steps between (data-parallel balancing); a deferred step spends none "
        "of Meridian's admissions",
    ),
    _refused(
        "cache_aware_admission_window",
        "0 (off)",
        lambda value: bool(value),
        "vLLM 0.34's cache-aware admission would reorder the waiting queue after Meridian ordered it; "
        "Meridian's prefix affinity (the `prefix_affinity` block of its configuration) ranks cached "
        "prefixes within its own order; measured on top of Meridian, vLLM's reorder moved requests meeting "
        "every target by -2 % to +2 % and raised interactive TTFAT p99 by up to 1.5x "
        "(docs/benchmarks/kv-and-prefix.md)",
    ),
    _honoured(
        "cache_aware_admission_threshold",
        "read by vLLM only with `cache_aware_admission_window`, which Meridian refuses: no effect",
    ),
    _honoured(
        "async_scheduling", "MeridianScheduler is vLLM's AsyncScheduler; without it the engine steps synchronously"
    ),
    _honoured("stream_interval", "vLLM's output streaming, after the scheduler"),
)

#: Every field of every supported release's ``SchedulerConfig``, by name.
KNOBS: dict[str, Knob] = {knob.field: knob for knob in _ROWS}


def check_scheduler_config(scheduler_config: Any) -> None:
    """Raises ``ConfigError`` naming the flag and why when a field holds a value Meridian refuses."""
    for knob in _ROWS:
        if knob.refused is None or not hasattr(scheduler_config, knob.field):
            continue
        value = getattr(scheduler_config, knob.field)
        if knob.refused(value):
            raise ConfigError(
                f"{knob.flag} {value!r} is not supported under meridian.vllm.MeridianScheduler: {knob.why}"
            )
