"""Translation between vLLM's objects and the plain values the core takes.

Nothing here decides anything: it reads vLLM's configuration (reasoning markers, limits, the
``meridian`` block of ``additional_config``) and requests (SLO class, finish status) and hands
back plain Python values, or raises a Meridian error that names the bad input.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from vllm.v1.request import RequestStatus

from meridian._core import Config, FinishedRequest
from meridian.errors import ConfigError, InvalidArgumentError

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)

#: Key of Meridian's block in ``--additional-config``.
CONFIG_KEY = "meridian"
#: Per-request SLO class, in ``vllm_xargs`` / ``SamplingParams.extra_args``.
CLASS_ARG = "meridian_class"

_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stopped",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "aborted",
    RequestStatus.FINISHED_IGNORED: "length",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass(frozen=True)
class ReasoningMarkerIds:
    """Token ids of the model's reasoning markers (empty ``end`` = the model does not reason)."""

    start: list[int]
    end: list[int]
    tool_calls: list[list[int]]


def config_from_vllm(vllm_config: VllmConfig) -> Config:
    """Validates the ``meridian`` block of ``additional_config`` (absent = defaults)."""
    additional = vllm_config.additional_config or {}
    if not isinstance(additional, dict):
        raise ConfigError(f"additional_config must be a JSON object, got {type(additional).__name__}")
    block = additional.get(CONFIG_KEY, {})
    if not isinstance(block, dict):
        raise ConfigError(
            f"invalid meridian config `meridian`: expected a JSON object, got {type(block).__name__}"
        )
    try:
        text = json.dumps(block)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid meridian config `meridian`: not JSON-serialisable ({exc})") from exc
    return Config.from_json(text)


def reasoning_markers(vllm_config: VllmConfig, config: Config) -> ReasoningMarkerIds:
    """Reads the reasoning markers vLLM derived from ``--reasoning-parser`` (never hard-coded)."""
    reasoning = vllm_config.reasoning_config
    if reasoning is None or not reasoning.enabled:
        return ReasoningMarkerIds(start=[], end=[], tool_calls=[])
    start = list(reasoning.reasoning_start_token_ids or [])
    end = list(reasoning.natural_reasoning_end_token_ids or [])
    return ReasoningMarkerIds(start=start, end=end, tool_calls=_tool_call_ids(vllm_config, config))


def _tool_call_ids(vllm_config: VllmConfig, config: Config) -> list[list[int]]:
    """Resolves the configured tool-call marker strings to single special-token ids."""
    markers = config.tool_call_markers
    if not markers or vllm_config.model_config is None or vllm_config.model_config.skip_tokenizer_init:
        return []
    from vllm.tokenizers import cached_tokenizer_from_config

    tokenizer = cached_tokenizer_from_config(model_config=vllm_config.model_config)
    vocab = tokenizer.get_vocab()
    resolved = []
    for marker in markers:
        token_id = vocab.get(marker)
        if token_id is None:
            # A marker that is not one token of this vocabulary would match ordinary text.
            logger.debug("meridian: tool-call marker %r is not a token of this model; ignored", marker)
            continue
        resolved.append([int(token_id)])
    return resolved


def requested_class(request: Request) -> str | None:
    """The ``meridian_class`` a request asked for, if any."""
    extra: dict[str, Any] | None = request.sampling_params.extra_args if request.sampling_params else None
    if not extra or CLASS_ARG not in extra:
        return None
    value = extra[CLASS_ARG]
    if not isinstance(value, str):
        raise InvalidArgumentError(
            f"request `{request.request_id}`: {CLASS_ARG} must be a string naming an SLO class, "
            f"got {value!r}"
        )
    return value


def finish_reason(status: RequestStatus) -> str:
    """The core's name for a vLLM finished status."""
    return _FINISH_REASONS.get(status, "stopped")


def prompt_token_ids(request: Request) -> list[int]:
    """The prompt's token ids (empty for embeddings-only prompts)."""
    return list(request.prompt_token_ids or [])


#: Fields of a finished-request report written to the request log, in order.
REPORT_FIELDS = (
    "req_id", "slo_class", "reason", "arrival_ms", "ttft_ms", "ttfat_ms", "transition_gap_ms", "think_tpot_ms",
    "answer_tpot_ms", "e2e_ms", "max_answer_gap_ms", "num_stalls", "num_think_tokens", "num_answer_tokens",
    "num_preemptions_prefill", "num_preemptions_think", "num_preemptions_answer", "met_all",
    "never_reusable_from_token",
)


def report_json(report: FinishedRequest, thinking_stop: tuple[str, int] | None = None) -> str:
    """One finished request's ledger as a JSON object on one line, with the thinking-control rule
    that ended its reasoning and after how many thinking tokens (both null when none did)."""
    line: dict[str, Any] = {name: getattr(report, name) for name in REPORT_FIELDS}
    line["thinking_stopped_by"], line["thinking_stopped_after_tokens"] = thinking_stop or (None, None)
    return json.dumps(line)


def open_log(path: str | None, key: str) -> IO[str] | None:
    """Opens a JSONL log for appending (line-buffered), or raises ``ConfigError`` naming ``key``."""
    if path is None:
        return None
    try:
        return open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - closed in shutdown()
    except OSError as exc:
        raise ConfigError(f"invalid meridian config `{key}`: cannot open {path!r} for appending: {exc}") from exc


def step_shape(output: SchedulerOutput, requests: dict[str, Request]) -> dict[str, int]:
    """The batch shape a replay profile's step time depends on (``meridian.replay.profiles``):
    prompt tokens computed, requests decoding one token, and KV tokens attention reads."""
    num_prefill_tokens = num_decode_requests = num_context_tokens = 0
    for req_id, num_tokens in output.num_scheduled_tokens.items():
        request = requests.get(req_id)
        if request is None:
            continue
        num_context_tokens += request.num_computed_tokens
        if request.num_computed_tokens - num_tokens >= request.num_prompt_tokens:
            num_decode_requests += 1
        else:
            num_prefill_tokens += num_tokens
    return {
        "num_prefill_tokens": num_prefill_tokens,
        "num_decode_requests": num_decode_requests,
        "num_context_tokens": num_context_tokens,
    }


def eat_probe(parent: Request, num_output_tokens: int, end_ids: list[int], serial: int) -> Request:
    """An internal EAT probe of ``parent``: its prompt and first ``num_output_tokens`` outputs,
    then the reasoning-end marker; one greedy token. It shares the parent's block hasher, LoRA and
    cache salt, so everything up to the parent's last full block is a prefix-cache hit."""
    from vllm import SamplingParams
    from vllm.v1.request import Request as VllmRequest

    from meridian.vllm.thinking import PROBE_FOR_ARG

    outputs = list(parent.output_token_ids[:num_output_tokens])
    params = SamplingParams(max_tokens=1, temperature=0.0, extra_args={PROBE_FOR_ARG: parent.request_id})
    return VllmRequest(
        request_id=f"{parent.request_id}-meridian-eat-probe-{serial}",
        prompt_token_ids=[*prompt_token_ids(parent), *outputs, *end_ids],
        sampling_params=params,
        pooling_params=None,
        client_index=parent.client_index,
        lora_request=parent.lora_request,
        cache_salt=parent.cache_salt,
        block_hasher=parent._block_hasher,
    )
