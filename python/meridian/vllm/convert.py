"""Translation between vLLM's objects and the plain values the core takes.

Nothing here decides anything: it reads vLLM's requests and scheduler outputs (SLO class asked
for, finish reason, batch shape), formats the core's reports (the request log line) and reads an
earlier run's log back into the core (the warm start), handing back plain Python values or
raising a Meridian error that names the bad input.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from meridian._core import Config, FinishedRequest, Meridian
from meridian._core import check_request_args as _core_check_request_args
from meridian.errors import ConfigError, InvalidArgumentError, MeridianError, RequestArgsError
from meridian.vllm.names import CLASS_ARG, REPORT_FIELDS, REQUEST_ARGS, THINKING_STOP_FIELDS, WAITED_ARG

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request


def extra_args(request: Request) -> dict[str, Any] | None:
    """A request's ``SamplingParams.extra_args`` (its ``vllm_xargs``), if any."""
    return request.sampling_params.extra_args if request.sampling_params else None


def check_request_args(
    extra: Mapping[str, Any] | None, config: Config | None, max_tokens: int | None = None, priority: int = 0
) -> None:
    """Checks a request's Meridian arguments (``REQUEST_ARGS`` in ``extra``) against ``config``,
    the server's configuration (``None``: the class's type only), and the request's
    ``max_tokens`` and ``priority`` (the answer room of its ``reasoning_effort``). The core
    decides; raises ``RequestArgsError`` naming the argument."""
    text = request_args_json(extra)
    if text is not None:
        _core_check_request_args(text, config, max_tokens, priority)


def request_args_json(extra: Mapping[str, Any] | None) -> str | None:
    """Meridian's arguments among ``extra`` as the JSON object the core reads (``None``: none);
    raises ``RequestArgsError`` naming an argument JSON cannot hold."""
    if not extra:
        return None
    args = {key: extra[key] for key in REQUEST_ARGS if key in extra}
    if not args:
        return None
    try:
        return json.dumps(args, allow_nan=False)
    except (TypeError, ValueError):
        # Only arguments given directly (vLLM's offline API) can hold what JSON cannot.
        key, value = next((k, v) for k, v in args.items() if not _is_json(v))
        raise RequestArgsError(f"invalid request argument `{key}`: {value!r} is not a JSON value") from None


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def requested_class(request: Request) -> str | None:
    """The ``meridian_class`` a request asked for, if any (``None`` counts as none)."""
    extra = extra_args(request)
    if not extra or extra.get(CLASS_ARG) is None:
        return None
    value = extra[CLASS_ARG]
    if not isinstance(value, str):
        raise InvalidArgumentError(
            f"request `{request.request_id}`: {CLASS_ARG} must be a string naming an SLO class, got {value!r}"
        )
    return value


def waited_ms(request: Request) -> float:
    """How long the request's client already waited for it elsewhere (``meridian_waited_ms``, a
    number the core has checked; 0 when absent)."""
    extra = extra_args(request)
    value = extra.get(WAITED_ARG) if extra else None
    return 0.0 if value is None else float(value)


def kv_handoff(request: Request) -> str | None:
    """The request's part in a prefill/decode hand-off as vLLM's KV connectors read its
    ``kv_transfer_params`` (read at arrival: NIXL clears ``do_remote_prefill`` once the load is
    under way): ``sends`` for ``do_remote_decode``, ``receives`` for ``do_remote_prefill``, else
    ``None``."""
    params = request.kv_transfer_params
    if not isinstance(params, dict):
        return None
    if params.get("do_remote_prefill"):
        return "receives"
    if params.get("do_remote_decode"):
        return "sends"
    return None


def finish_reason(request: Request) -> str:
    """vLLM's own finish reason of a finished request, as it names it on the wire (``stop``,
    ``length``, ``abort``, ``error``, …); the status name when vLLM maps it to none. The core
    decides what each means."""
    reason = request.get_finished_reason()
    return str(reason) if reason is not None else request.status.name.lower()


def prompt_token_ids(request: Request) -> list[int]:
    """The prompt's token ids (empty for embeddings-only prompts)."""
    return list(request.prompt_token_ids or [])


def report_json(report: FinishedRequest) -> str:
    """One finished request's ledger as a JSON object on one line, with the thinking-control rule
    that ended its reasoning and after how many thinking tokens (both null when none did)."""
    line: dict[str, Any] = {name: getattr(report, name) for name in (*REPORT_FIELDS, *THINKING_STOP_FIELDS)}
    return json.dumps(line)


#: Bytes read from the end of a warm-start log: some ten thousand finished requests, more than the
#: predictors remember, read in well under a second.
WARM_START_MAX_BYTES = 8 << 20


def rank_log_path(path: str, rank: int | None) -> str:
    """The file a data-parallel rank's log lives in: the configured one for rank 0,
    ``<stem>.dp<rank><suffix>`` beside it for the others."""
    if not rank:
        return path
    configured = Path(path)
    return str(configured.with_name(f"{configured.stem}.dp{rank}{configured.suffix}"))


def warm_start(core: Meridian, config: Config, rank: int | None = None) -> tuple[str, int, int] | None:
    """Teaches ``core`` the lengths of a previous run's finished requests: the end of
    ``warm_start_path``, else of the server's own request log when it exists already. Returns
    ``(path, lines learnt from, lines skipped)``, or ``None`` when there is nothing to read. A
    line that is not one of the log's (torn, foreign, of a class this configuration lacks) is
    skipped; a file that cannot be read is the operator's to fix: ``ConfigError`` naming the key."""
    if not config.warm_start:
        return None
    key = "warm_start_path" if config.warm_start_path is not None else "request_log_path"
    configured = config.warm_start_path or config.request_log_path
    if configured is None:
        return None
    path = configured if config.warm_start_path is not None else rank_log_path(configured, rank)
    if config.warm_start_path is None and not os.path.exists(path):
        return None  # the first run of this server: nothing to learn yet
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            start = max(0, log.tell() - WARM_START_MAX_BYTES)
            log.seek(start)
            lines = log.read().splitlines()[1 if start else 0 :]  # the first may be cut
    except OSError as exc:
        raise ConfigError(f"invalid meridian config `{key}`: cannot read {path!r} to warm start from: {exc}") from exc
    learnt = skipped = 0
    for line in lines:
        try:
            entry = json.loads(line)
            taught = core.learn_from_history(
                str(entry["slo_class"]),
                str(entry["reason"]),
                entry["ttfat_ms"] is not None,
                int(entry["num_think_tokens"]),
                int(entry["num_answer_tokens"]),
                str(entry.get("kv_handoff", "local")),
            )
        except (ValueError, KeyError, TypeError, OverflowError, MeridianError):
            taught = False
        learnt += taught
        skipped += not taught
    return path, learnt, skipped


def open_log(path: str | None, key: str, rank: int | None = None) -> IO[str] | None:
    """Opens a JSONL log for appending (line-buffered), or raises ``ConfigError`` naming ``key``.
    With data parallelism each rank past the first (``rank`` > 0) writes its own file,
    ``<stem>.dp<rank><suffix>`` next to the configured path: the ranks share one configuration,
    not one file. (vLLM tells a non-MoE rank only its index, not the rank count: rank 0 keeps
    the configured name.)"""
    if path is None:
        return None
    path = rank_log_path(path, rank)
    try:
        return open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - closed in shutdown()
    except OSError as exc:
        raise ConfigError(f"invalid meridian config `{key}`: cannot open {path!r} for appending: {exc}") from exc


def step_shape(output: SchedulerOutput, requests: dict[str, Request]) -> dict[str, int]:
    """The batch shape a step's time depends on (the core's step-time model, the replay's
    profiles): prompt tokens computed, requests decoding one token, and KV tokens attention reads."""
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


#: Bytes of a block hash as the core takes it: vLLM's own 64-bit reduction (its
#: ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``: the last 8 bytes, big-endian).
HASH_KEY_BYTES = 8
#: The core's block-event codes (``Meridian.on_block_events``).
OP_REMOVED, OP_STORED, OP_CLEARED = 0, 1, 2


def hash_key(block_hash: bytes | int) -> bytes:
    """A block hash (vLLM's bytes, or the int its KV events may carry) as the core's 8-byte key."""
    if isinstance(block_hash, int):
        return (block_hash & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(HASH_KEY_BYTES, "big")
    return bytes(block_hash[-HASH_KEY_BYTES:]).rjust(HASH_KEY_BYTES, b"\0")


def block_hash_keys(block_hashes: list[Any]) -> bytes:
    """A prompt's block hashes as the core takes them, back to back."""
    return b"".join(hash_key(h) for h in block_hashes)


class BlockEvents:
    """Block stores and removals of one medium, in order, as ``Meridian.on_block_events`` takes
    them; ``take`` empties it."""

    def __init__(self) -> None:
        self._ops = bytearray()
        self._hashes = bytearray()

    def __bool__(self) -> bool:
        return bool(self._ops)

    def stored(self, block_hashes: list[Any]) -> None:
        self._add(OP_STORED, block_hashes)

    def removed(self, block_hashes: list[Any]) -> None:
        self._add(OP_REMOVED, block_hashes)

    def cleared(self) -> None:
        self._ops.append(OP_CLEARED)

    def take(self) -> tuple[bytes, bytes]:
        ops, hashes = bytes(self._ops), bytes(self._hashes)
        self._ops.clear()
        self._hashes.clear()
        return ops, hashes

    def _add(self, op: int, block_hashes: list[Any]) -> None:
        for block_hash in block_hashes:
            self._ops.append(op)
            self._hashes += hash_key(block_hash)


def device_block_events(events: list[Any], into: BlockEvents) -> None:
    """vLLM's KV cache events (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``) as block
    events of the device cache."""
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

    for event in events:
        if isinstance(event, BlockStored):
            into.stored(event.block_hashes)
        elif isinstance(event, BlockRemoved):
            into.removed(event.block_hashes)
        elif isinstance(event, AllBlocksCleared):
            into.cleared()
