"""What Meridian reads from vLLM's configuration, read in one place.

The ``meridian`` block of ``--additional-config`` (validated by the core, errors name the key),
the reasoning markers vLLM derived from ``--reasoning-parser`` (never hard-coded), the model's
tokenizer, the configured tool-call markers looked up in its vocabulary (what a marker that is
not one token means is the core's decision), and which of Meridian's classes vLLM was told to
load. ``MeridianScheduler`` and ``MeridianThinkingProcessor`` both start from
``read_settings``. Invariant: nothing here decides policy; it reads vLLM's objects and hands back
plain values, or raises a Meridian error that names the bad input.
"""

from __future__ import annotations

import importlib
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meridian._core import Config
from meridian.errors import ConfigError
from meridian.vllm.names import CONFIG_KEY, LOGITS_PROCESSOR, SCHEDULER_CLS

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = logging.getLogger("meridian")


@dataclass(frozen=True)
class ReasoningMarkerIds:
    """Token ids of the model's reasoning markers (empty ``end`` = the model does not reason)."""

    start: list[int]
    #: What the model emits to end its reasoning (phase tracking).
    end: list[int]
    #: What thinking control forces to end it (vLLM's ``reasoning_end_token_ids``).
    forced_end: list[int]
    #: Single-token tool-call markers.
    tool_calls: list[list[int]]


@dataclass(frozen=True)
class MeridianSettings:
    """Everything Meridian takes from one ``VllmConfig``."""

    config: Config
    markers: ReasoningMarkerIds
    #: The model's tokenizer (``None`` with ``skip_tokenizer_init``).
    tokenizer: Any


def read_settings(vllm_config: VllmConfig, *, resolve_tool_calls: bool = True) -> MeridianSettings:
    """Reads and validates Meridian's settings from ``vllm_config``; raises ``ConfigError``."""
    config = config_from_vllm(vllm_config)
    tokenizer = _tokenizer(vllm_config)
    reasoning = vllm_config.reasoning_config
    if reasoning is None or not reasoning.enabled:
        return MeridianSettings(config, ReasoningMarkerIds([], [], [], []), tokenizer)
    end = list(reasoning.natural_reasoning_end_token_ids or [])
    markers = ReasoningMarkerIds(
        start=list(reasoning.reasoning_start_token_ids or []),
        end=end,
        forced_end=list(reasoning.reasoning_end_token_ids or []) or end,
        tool_calls=[[i] for i in _tool_call_ids(config, tokenizer)] if resolve_tool_calls else [],
    )
    return MeridianSettings(config, markers, tokenizer)


def config_from_vllm(vllm_config: VllmConfig) -> Config:
    """Validates the ``meridian`` block of ``additional_config`` (absent = defaults)."""
    return config_from_additional(vllm_config.additional_config or {})


def check_additional_config(text: str) -> str:
    """``meridian check-config``: validates an ``--additional-config`` value as vLLM would hand it
    over; returns a one-line summary or raises ``ConfigError`` naming the problem."""
    try:
        additional = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--additional-config is not valid JSON: {exc}") from exc
    config = config_from_additional(additional)
    return f"ok: classes {', '.join(config.class_names)} (default {config.default_class})"


def config_from_additional(additional: Any) -> Config:
    """Validates the ``meridian`` block of an ``additional_config`` value (absent = defaults)."""
    if not isinstance(additional, dict):
        raise ConfigError(f"additional_config must be a JSON object, got {type(additional).__name__}")
    block = additional.get(CONFIG_KEY, {})
    if not isinstance(block, dict):
        raise ConfigError(f"invalid meridian config `{CONFIG_KEY}`: expected a JSON object, got {type(block).__name__}")
    try:
        text = json.dumps(block)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid meridian config `{CONFIG_KEY}`: not JSON-serialisable ({exc})") from exc
    return Config.from_json(text)


def runs_meridian_scheduler(vllm_config: VllmConfig) -> bool:
    """Whether vLLM runs ``MeridianScheduler`` (or a subclass of it) as ``--scheduler-cls``: the one
    check the middleware, the logits processor and the metrics plugin share. Read from the class
    path and the class's bases by name, so the API server needs no import of the scheduler; a
    class path that does not import is not Meridian's."""
    scheduler_cls = vllm_config.scheduler_config.scheduler_cls
    if isinstance(scheduler_cls, str):
        if scheduler_cls == SCHEDULER_CLS:
            return True
        module, _, name = scheduler_cls.rpartition(".")
        try:
            scheduler_cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            return False
    return isinstance(scheduler_cls, type) and any(
        f"{base.__module__}.{base.__qualname__}" == _SCHEDULER_DEFINED_AT for base in scheduler_cls.__mro__
    )


#: Where ``MeridianScheduler`` is defined (``SCHEDULER_CLS`` is the path it is exported under).
_SCHEDULER_DEFINED_AT = "meridian.vllm.scheduler.MeridianScheduler"


def processor_configured(vllm_config: VllmConfig) -> bool:
    """Whether vLLM was told to load ``MeridianThinkingProcessor`` (``--logits-processors``)."""
    model_config = vllm_config.model_config
    entries = (model_config.logits_processors or []) if model_config is not None else []
    class_name = LOGITS_PROCESSOR.rsplit(":", 1)[1]
    return any(
        getattr(entry, "__name__", None) == class_name or (isinstance(entry, str) and entry.endswith(f":{class_name}"))
        for entry in entries
    )


def _tool_call_ids(config: Config, tokenizer: Any) -> list[int]:
    markers = config.tool_call_markers
    if not markers:
        return []
    if tokenizer is None:
        logger.info("meridian: no tokenizer (skip_tokenizer_init); tool-call markers are not resolved")
        return []
    vocab = tokenizer.get_vocab()
    ids = config.resolve_tool_call_markers([_int_or_none(vocab.get(marker)) for marker in markers])
    if len(ids) < len(markers):
        logger.warning(
            "meridian: the default tool-call marker(s) %s are not tokens of this model; reasoning blocks of "
            "requests that end in a tool call are evicted like any other (set `tool_call_markers`)",
            ", ".join(markers),
        )
    return ids


def _int_or_none(value: Any) -> int | None:
    return int(value) if value is not None else None


def _tokenizer(vllm_config: VllmConfig) -> Any:
    model_config = vllm_config.model_config
    if model_config is None or model_config.skip_tokenizer_init:
        return None
    from vllm.tokenizers import cached_tokenizer_from_config

    return cached_tokenizer_from_config(model_config=model_config)
