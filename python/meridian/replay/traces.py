"""Workload traces for ``meridian replay``: this module owns turning trace files (Mooncake JSONL,
Azure LLM CSV, Meridian's own JSONL) into ``TraceRequest`` lists, merging several of them, and the
pure transforms applied before a replay (time window, rate scaling, truncation, SLO classes). Its
invariant: every list it returns is sorted by ``arrival_ms`` with the first request at 0.0, has
unique ``req_id``s, and holds only requests that passed ``TraceRequest``'s own checks, so a
malformed file fails here, naming the file, the 1-based line and the bad field, never later
inside a replay.
"""

from __future__ import annotations

import datetime as dt
import difflib
import functools
import json
import math
import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from meridian.errors import TraceError

__all__ = [
    "AZURE_HEADER",
    "FORMATS",
    "MOONCAKE_BLOCK_SIZE",
    "TraceError",
    "TraceRequest",
    "TraceWarning",
    "assign_classes",
    "dump_meridian_jsonl",
    "limit",
    "load_azure",
    "load_meridian_jsonl",
    "load_mooncake",
    "load_trace",
    "load_traces",
    "scale_rate",
    "window",
]

#: Tokens per hashed prompt block in the Mooncake traces (``len(hash_ids) == ceil(input/512)``).
MOONCAKE_BLOCK_SIZE = 512
#: The exact header of the Azure LLM inference CSVs (2023 Splitwise and 2024 week-long traces).
AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
#: Names accepted by ``load_trace(format=...)``.
FORMATS = ("mooncake", "azure", "meridian")

PathLike = str | Path


class TraceWarning(UserWarning):
    """A trace was loaded, but some of its rows were left out (the message says which and why)."""


class _InvalidRequest(TraceError):
    """``TraceRequest``'s own check failed; loaders re-raise it with the file and line prepended."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


@dataclass(frozen=True)
class TraceRequest:
    """One request of a workload trace. Construction checks every field (``TraceError`` otherwise)."""

    req_id: str  # unique within a trace
    arrival_ms: float  # relative to the trace's first request; non-decreasing in list order
    num_prompt_tokens: int  # >= 1
    num_output_tokens: int  # generated tokens the trace records, >= 1
    num_think_tokens: int | None  # None when the trace has no thinking/answer split
    num_answer_tokens: int | None  # None without a split; else think + answer == output, answer >= 1
    slo_class: str | None = None  # None = the scheduler's default class
    source: str = ""  # label of the file/stream it came from ("code", "conv", "mooncake", ...)
    prefix_block_hashes: tuple[int, ...] = ()  # ids of the prompt's blocks (same id = same prefix)
    hash_block_size: int | None = None  # tokens per hashed block; None without hashes

    def __post_init__(self) -> None:
        problem = _request_problem(self)
        if problem is not None:
            raise _InvalidRequest(problem)

    @property
    def has_split(self) -> bool:
        """Whether the request carries a thinking/answer split."""
        return self.num_think_tokens is not None


def _is_int(value: object) -> bool:
    # bool is an int subclass, but True is never a token count.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value)


def _request_problem(r: TraceRequest) -> str | None:
    """What is wrong with ``r`` (the first problem found), or None. Field names are the dataclass's."""
    if not isinstance(r.req_id, str) or not r.req_id:
        return f"'req_id' must be a non-empty string, got {r.req_id!r}"
    if not _is_number(r.arrival_ms) or r.arrival_ms < 0:
        return f"'arrival_ms' must be a non-negative number, got {r.arrival_ms!r}"
    for name in ("num_prompt_tokens", "num_output_tokens"):
        value = getattr(r, name)
        if not _is_int(value) or value < 1:
            return f"{name!r} must be a positive integer, got {value!r}"
    split_problem = _split_problem(r.num_output_tokens, r.num_think_tokens, r.num_answer_tokens)
    if split_problem is not None:
        return split_problem
    if r.slo_class is not None and (not isinstance(r.slo_class, str) or not r.slo_class):
        return f"'slo_class' must be a non-empty string or None, got {r.slo_class!r}"
    if not isinstance(r.source, str):
        return f"'source' must be a string, got {r.source!r}"
    return _hash_problem(r.num_prompt_tokens, r.prefix_block_hashes, r.hash_block_size)


def _split_problem(output: int, think: int | None, answer: int | None) -> str | None:
    if think is None and answer is None:
        return None
    if think is None or answer is None:
        return "'num_think_tokens' and 'num_answer_tokens' must be given together (or neither)"
    if not _is_int(think) or think < 0:
        return f"'num_think_tokens' must be a non-negative integer, got {think!r}"
    if not _is_int(answer) or answer < 1:
        return f"'num_answer_tokens' must be a positive integer, got {answer!r}"
    if think + answer != output:
        return (
            f"'num_think_tokens' + 'num_answer_tokens' = {think} + {answer} must equal 'num_output_tokens' = {output}"
        )
    return None


def _hash_problem(prompt: int, hashes: tuple[int, ...], block_size: int | None) -> str | None:
    if not isinstance(hashes, tuple) or not all(_is_int(h) for h in hashes):
        return f"'prefix_block_hashes' must be a tuple of integers, got {hashes!r}"
    if not hashes:
        if block_size is not None:
            return "'hash_block_size' is given but 'prefix_block_hashes' is empty"
        return None
    if not _is_int(block_size) or block_size is None or block_size < 1:
        return f"'hash_block_size' must be a positive integer when hashes are given, got {block_size!r}"
    expected = math.ceil(prompt / block_size)
    if len(hashes) != expected:
        return (
            f"'prefix_block_hashes' has {len(hashes)} entries, but {prompt} prompt tokens in "
            f"blocks of {block_size} need ceil({prompt}/{block_size}) = {expected}"
        )
    return None


@contextmanager
def _at(loc: str) -> Iterator[None]:
    """Prefix a failed ``TraceRequest`` check with the file and line it came from."""
    try:
        yield
    except _InvalidRequest as exc:
        raise TraceError(f"{loc}: {exc.problem}") from None


# --------------------------------------------------------------------------------------------
# Field readers: each names the location, the key and the bad value.


def _int_desc(minimum: int) -> str:
    return {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")


def _require(obj: dict[str, Any], key: str, loc: str) -> Any:
    if key not in obj or obj[key] is None:
        raise TraceError(f"{loc}: missing key {key!r}")
    return obj[key]


def _json_int(obj: dict[str, Any], key: str, loc: str, minimum: int) -> int:
    value = _require(obj, key, loc)
    if not _is_int(value) or value < minimum:
        raise TraceError(f"{loc}: {key!r} must be {_int_desc(minimum)}, got {value!r}")
    return int(value)


def _json_time(obj: dict[str, Any], key: str, loc: str) -> float:
    value = _require(obj, key, loc)
    if not _is_number(value) or value < 0:
        raise TraceError(f"{loc}: {key!r} must be a non-negative number, got {value!r}")
    return float(value)


def _json_str(obj: dict[str, Any], key: str, loc: str) -> str:
    value = _require(obj, key, loc)
    if not isinstance(value, str) or not value:
        raise TraceError(f"{loc}: {key!r} must be a non-empty string, got {value!r}")
    return value


def _json_int_list(obj: dict[str, Any], key: str, loc: str) -> tuple[int, ...]:
    value = _require(obj, key, loc)
    if not isinstance(value, list) or not all(_is_int(v) for v in value):
        shown = value if not isinstance(value, list) else next(v for v in value if not _is_int(v))
        raise TraceError(f"{loc}: {key!r} must be a list of integers, got {shown!r}")
    return tuple(value)


def _text_int(text: str, field: str, loc: str, minimum: int) -> int:
    stripped = text.strip()
    if re.fullmatch(r"[+-]?\d+", stripped) is None or int(stripped) < minimum:
        raise TraceError(f"{loc}: {field!r} must be {_int_desc(minimum)}, got {text!r}")
    return int(stripped)


def _check_order(previous: tuple[float, int] | None, now: float, key: str, loc: str) -> None:
    """Arrivals must be non-decreasing: a replay needs them in order, and sorting silently would
    hide a corrupted or concatenated file."""
    if previous is not None and now < previous[0]:
        raise TraceError(
            f"{loc}: {key!r} {now:g} is earlier than line {previous[1]}'s {previous[0]:g}; "
            f"the trace must be sorted by arrival time"
        )


def _open_text(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, line) of a text file; read errors become ``TraceError``s."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            yield from enumerate(handle, start=1)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _jsonl_objects(path: Path) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(line number, "file:line", object) for each non-blank line; blank lines are skipped."""
    for lineno, line in _open_text(path):
        if not line.strip():
            continue
        loc = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{loc}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{loc}: expected a JSON object, got {type(obj).__name__}")
        yield lineno, loc, obj


@dataclass(frozen=True)
class _Loaded:
    """A loaded trace plus where its first request sits on the wall clock (None: no wall clock),
    kept so several traces of the same period can be merged on absolute time."""

    requests: list[TraceRequest]
    wall_origin_ns: int | None


def _empty_check(path: Path, requests: list[TraceRequest]) -> list[TraceRequest]:
    if not requests:
        raise TraceError(f"{path}: the trace holds no requests")
    return requests


# --------------------------------------------------------------------------------------------
# Mooncake


def load_mooncake(path: PathLike) -> list[TraceRequest]:
    """Mooncake JSONL (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids`` of 512-token
    blocks). Ids are ``mooncake-<line>``; other keys are ignored (third-party format)."""
    return _read_mooncake(Path(path)).requests


def _read_mooncake(path: Path) -> _Loaded:
    rows: list[tuple[int, str, float, int, int, tuple[int, ...]]] = []
    previous: tuple[float, int] | None = None
    for lineno, loc, obj in _jsonl_objects(path):
        timestamp = _json_time(obj, "timestamp", loc)
        _check_order(previous, timestamp, "timestamp", loc)
        previous = (timestamp, lineno)
        prompt = _json_int(obj, "input_length", loc, 1)
        output = _json_int(obj, "output_length", loc, 1)
        hashes = _json_int_list(obj, "hash_ids", loc)
        blocks = math.ceil(prompt / MOONCAKE_BLOCK_SIZE)
        if len(hashes) != blocks:
            raise TraceError(
                f"{loc}: 'hash_ids' has {len(hashes)} entries, but input_length {prompt} needs "
                f"ceil({prompt}/{MOONCAKE_BLOCK_SIZE}) = {blocks}"
            )
        rows.append((lineno, loc, timestamp, prompt, output, hashes))
    origin = rows[0][2] if rows else 0.0
    requests = []
    for lineno, loc, timestamp, prompt, output, hashes in rows:
        with _at(loc):
            requests.append(
                TraceRequest(
                    req_id=f"mooncake-{lineno}",
                    arrival_ms=timestamp - origin,
                    num_prompt_tokens=prompt,
                    num_output_tokens=output,
                    num_think_tokens=None,
                    num_answer_tokens=None,
                    source="mooncake",
                    prefix_block_hashes=hashes,
                    hash_block_size=MOONCAKE_BLOCK_SIZE,
                )
            )
    return _Loaded(_empty_check(path, requests), wall_origin_ns=None)


# --------------------------------------------------------------------------------------------
# Azure LLM inference CSV

_AZURE_TIMESTAMP = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?")
_EPOCH = dt.datetime(1970, 1, 1)


def _azure_source(path: Path) -> str:
    name = path.name
    if "_code" in name:
        return "code"
    if "_conv" in name:
        return "conv"
    return path.stem


def _parse_azure_timestamp(text: str, loc: str) -> int:
    """Nanoseconds since 1970 of a zone-less wall-clock text. Parsed by hand because the files
    carry 7 fractional digits, which ``datetime`` rejects; integers keep every digit."""
    match = _AZURE_TIMESTAMP.fullmatch(text.strip())
    if match is None:
        raise TraceError(f"{loc}: 'TIMESTAMP' must look like '2023-11-16 18:15:46.6805900', got {text!r}")
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    if hour > 23 or minute > 59 or second > 59:
        raise TraceError(f"{loc}: 'TIMESTAMP' {text!r} is not a valid time of day")
    day_start = _day_start_s(year, month, day)
    if day_start is None:
        raise TraceError(f"{loc}: 'TIMESTAMP' {text!r} is not a valid date")
    whole_seconds = day_start + hour * 3600 + minute * 60 + second
    fraction_ns = int((match.group(7) or "").ljust(9, "0"))
    return whole_seconds * 1_000_000_000 + fraction_ns


@functools.lru_cache(maxsize=64)
def _day_start_s(year: int, month: int, day: int) -> int | None:
    """Seconds from 1970 to the day's midnight, None for an impossible date. Cached: a trace spans
    few days, and building a datetime per row dominated the load time."""
    try:
        moment = dt.datetime(year, month, day)
    except ValueError:
        return None
    return (moment - _EPOCH) // dt.timedelta(seconds=1)


def load_azure(path: PathLike) -> list[TraceRequest]:
    """Azure LLM inference CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``). Source is "code" or
    "conv" by file name, else the file stem; ids are ``<source>-<line>``.

    Rows with ``GeneratedTokens == 0`` are skipped with a ``TraceWarning`` that counts them: such a
    request produced nothing to decode (a failed or cancelled call), so there is nothing to replay,
    yet one such row should not make a whole production trace unusable. The 2023 code/conv files
    have none. Every other malformed row is an error.
    """
    return _read_azure(Path(path)).requests


def _read_azure(path: Path) -> _Loaded:
    lines = _open_text(path)
    header_line = next(lines, None)
    expected = ",".join(AZURE_HEADER)
    if header_line is None or tuple(f.strip() for f in header_line[1].split(",")) != AZURE_HEADER:
        got = "an empty file" if header_line is None else repr(header_line[1].rstrip("\r\n"))
        raise TraceError(f"{path}:1: expected the Azure LLM header {expected!r}, got {got}")
    rows: list[tuple[int, str, int, int, int]] = []
    skipped: list[int] = []
    previous: tuple[int, int, str] | None = None  # (ns, line, text) of the previous row
    for lineno, line in lines:
        if not line.strip():
            continue
        loc = f"{path}:{lineno}"
        # The Azure files never quote a field, so a plain split is exact (and 3x faster than csv).
        fields = line.rstrip("\r\n").split(",")
        if len(fields) != len(AZURE_HEADER):
            raise TraceError(f"{loc}: expected {len(AZURE_HEADER)} comma-separated fields, got {len(fields)}")
        stamp_ns = _parse_azure_timestamp(fields[0], loc)
        if previous is not None and stamp_ns < previous[0]:
            raise TraceError(
                f"{loc}: 'TIMESTAMP' {fields[0].strip()!r} is earlier than line {previous[1]}'s "
                f"{previous[2]!r}; the trace must be sorted by arrival time"
            )
        previous = (stamp_ns, lineno, fields[0].strip())
        prompt = _text_int(fields[1], "ContextTokens", loc, 1)
        output = _text_int(fields[2], "GeneratedTokens", loc, 0)
        if output == 0:
            skipped.append(lineno)
            continue
        rows.append((lineno, loc, stamp_ns, prompt, output))
    if skipped:
        warnings.warn(
            f"{path}: skipped {len(skipped)} row(s) with GeneratedTokens = 0 (first at line "
            f"{skipped[0]}): nothing to decode",
            TraceWarning,
            stacklevel=3,
        )
    source = _azure_source(path)
    origin_ns = rows[0][2] if rows else 0
    requests = []
    for lineno, loc, stamp_ns, prompt, output in rows:
        with _at(loc):
            requests.append(
                TraceRequest(
                    req_id=f"{source}-{lineno}",
                    arrival_ms=(stamp_ns - origin_ns) / 1e6,
                    num_prompt_tokens=prompt,
                    num_output_tokens=output,
                    num_think_tokens=None,
                    num_answer_tokens=None,
                    source=source,
                )
            )
    return _Loaded(_empty_check(path, requests), wall_origin_ns=origin_ns)


# --------------------------------------------------------------------------------------------
# Meridian's own JSONL

_MERIDIAN_KEYS = (
    "req_id",
    "arrival_ms",
    "num_prompt_tokens",
    "num_output_tokens",
    "num_think_tokens",
    "num_answer_tokens",
    "slo_class",
    "source",
    "prefix_block_hashes",
    "hash_block_size",
)


def _reject_unknown_keys(obj: dict[str, Any], loc: str) -> None:
    # A misspelt optional key would otherwise be dropped silently (e.g. a lost slo_class).
    for key in obj:
        if key not in _MERIDIAN_KEYS:
            close = difflib.get_close_matches(str(key), _MERIDIAN_KEYS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(_MERIDIAN_KEYS)}"
            raise TraceError(f"{loc}: unknown key {key!r}{hint}")


def _present(obj: dict[str, Any], key: str) -> bool:
    return obj.get(key) is not None


def _meridian_lengths(obj: dict[str, Any], loc: str) -> tuple[int, int | None, int | None]:
    """(output, think, answer): the split if given (a num_output_tokens beside it must agree),
    else num_output_tokens alone."""
    has_think, has_answer = _present(obj, "num_think_tokens"), _present(obj, "num_answer_tokens")
    if has_think != has_answer:
        missing = "num_answer_tokens" if has_think else "num_think_tokens"
        raise TraceError(f"{loc}: missing key {missing!r} (num_think_tokens and num_answer_tokens go together)")
    if not has_think:
        if not _present(obj, "num_output_tokens"):
            raise TraceError(
                f"{loc}: missing key 'num_output_tokens' (or the pair num_think_tokens, num_answer_tokens)"
            )
        return _json_int(obj, "num_output_tokens", loc, 1), None, None
    think = _json_int(obj, "num_think_tokens", loc, 0)
    answer = _json_int(obj, "num_answer_tokens", loc, 1)
    if _present(obj, "num_output_tokens"):
        output = _json_int(obj, "num_output_tokens", loc, 1)
        if output != think + answer:
            raise TraceError(
                f"{loc}: 'num_output_tokens' {output} != num_think_tokens + num_answer_tokens = {think + answer}"
            )
    return think + answer, think, answer


def _meridian_hashes(obj: dict[str, Any], loc: str) -> tuple[tuple[int, ...], int | None]:
    has_hashes, has_size = _present(obj, "prefix_block_hashes"), _present(obj, "hash_block_size")
    if has_size and not has_hashes:
        raise TraceError(f"{loc}: 'hash_block_size' is given without 'prefix_block_hashes'")
    if not has_hashes:
        return (), None
    hashes = _json_int_list(obj, "prefix_block_hashes", loc)
    if not has_size:
        raise TraceError(f"{loc}: missing key 'hash_block_size' (required with 'prefix_block_hashes')")
    return hashes, _json_int(obj, "hash_block_size", loc, 1)


def load_meridian_jsonl(path: PathLike) -> list[TraceRequest]:
    """Meridian's own JSONL: one object a line with ``arrival_ms`` (>= 0, sorted), ``num_prompt_tokens``,
    and ``num_think_tokens`` + ``num_answer_tokens`` and/or ``num_output_tokens``; optional ``req_id``
    (default ``req-<line>``), ``slo_class``, ``source`` (default: file stem), ``prefix_block_hashes``
    with ``hash_block_size``. Unknown keys are errors; arrivals are rebased so the first is 0.0."""
    return _read_meridian(Path(path)).requests


def _read_meridian(path: Path) -> _Loaded:
    requests: list[TraceRequest] = []
    seen_ids: dict[str, int] = {}
    previous: tuple[float, int] | None = None
    origin: float | None = None
    for lineno, loc, obj in _jsonl_objects(path):
        _reject_unknown_keys(obj, loc)
        arrival = _json_time(obj, "arrival_ms", loc)
        _check_order(previous, arrival, "arrival_ms", loc)
        previous = (arrival, lineno)
        origin = arrival if origin is None else origin
        req_id = _json_str(obj, "req_id", loc) if _present(obj, "req_id") else f"req-{lineno}"
        if req_id in seen_ids:
            raise TraceError(f"{loc}: 'req_id' {req_id!r} repeats line {seen_ids[req_id]}")
        seen_ids[req_id] = lineno
        output, think, answer = _meridian_lengths(obj, loc)
        hashes, block_size = _meridian_hashes(obj, loc)
        source = obj["source"] if _present(obj, "source") else path.stem
        if not isinstance(source, str):
            raise TraceError(f"{loc}: 'source' must be a string, got {source!r}")
        prompt = _json_int(obj, "num_prompt_tokens", loc, 1)
        with _at(loc):
            requests.append(
                TraceRequest(
                    req_id=req_id,
                    arrival_ms=arrival - origin,
                    num_prompt_tokens=prompt,
                    num_output_tokens=output,
                    num_think_tokens=think,
                    num_answer_tokens=answer,
                    slo_class=_json_str(obj, "slo_class", loc) if _present(obj, "slo_class") else None,
                    source=source,
                    prefix_block_hashes=hashes,
                    hash_block_size=block_size,
                )
            )
    return _Loaded(_empty_check(path, requests), wall_origin_ns=None)


def _meridian_record(r: TraceRequest) -> dict[str, Any]:
    record: dict[str, Any] = {
        "req_id": r.req_id,
        "arrival_ms": r.arrival_ms,
        "num_prompt_tokens": r.num_prompt_tokens,
        "num_output_tokens": r.num_output_tokens,
    }
    if r.has_split:
        record["num_think_tokens"] = r.num_think_tokens
        record["num_answer_tokens"] = r.num_answer_tokens
    if r.slo_class is not None:
        record["slo_class"] = r.slo_class
    # Always written, even when empty, so that loading gives back exactly this label.
    record["source"] = r.source
    if r.prefix_block_hashes:
        record["prefix_block_hashes"] = list(r.prefix_block_hashes)
        record["hash_block_size"] = r.hash_block_size
    return record


def dump_meridian_jsonl(requests: Sequence[TraceRequest], path: PathLike) -> None:
    """Write ``requests`` in Meridian's JSONL format; ``load_meridian_jsonl`` gives them back equal
    (given the module invariant: sorted, unique ids, first arrival at 0.0)."""
    _check_list(requests, "dump_meridian_jsonl")
    lines = [json.dumps(_meridian_record(r), separators=(", ", ": ")) + "\n" for r in requests]
    Path(path).write_text("".join(lines), encoding="utf-8")


def _check_list(requests: Sequence[TraceRequest], what: str) -> None:
    seen: set[str] = set()
    for i, r in enumerate(requests):
        if i and r.arrival_ms < requests[i - 1].arrival_ms:
            raise TraceError(f"{what}: request {i} ({r.req_id!r}) arrives before request {i - 1}")
        if r.req_id in seen:
            raise TraceError(f"{what}: req_id {r.req_id!r} appears twice")
        seen.add(r.req_id)


# --------------------------------------------------------------------------------------------
# Format inference and merging


def _infer_format(path: Path) -> str:
    if path.suffix.lower() == ".csv":
        return "azure"
    for _lineno, _loc, obj in _jsonl_objects(path):
        # Mooncake's keys are distinctive; everything else must be Meridian's strict format.
        return "mooncake" if "hash_ids" in obj or "input_length" in obj else "meridian"
    raise TraceError(f"{path}: the trace holds no requests")


def _read(path: Path, format: str | None) -> _Loaded:
    fmt = _infer_format(path) if format is None else format
    if fmt == "mooncake":
        return _read_mooncake(path)
    if fmt == "azure":
        return _read_azure(path)
    if fmt == "meridian":
        return _read_meridian(path)
    raise TraceError(f"unknown trace format {format!r}; expected one of {', '.join(FORMATS)}")


def load_trace(path: PathLike, format: str | None = None) -> list[TraceRequest]:
    """Load one trace. ``format``: "mooncake", "azure", "meridian", or None to infer it (``.csv`` is
    Azure; a JSONL whose first object has ``hash_ids``/``input_length`` is Mooncake, else Meridian)."""
    return _read(Path(path), format).requests


def load_traces(paths: Sequence[PathLike], format: str | None = None) -> list[TraceRequest]:
    """Load several traces and merge them by arrival time.

    Traces with a wall clock (Azure) are placed on their common absolute timeline, so the Azure
    code and conversation files, which cover the same hour, interleave as they really did. Traces
    without one (Mooncake, Meridian JSONL) start at the common origin. Ties keep the order of
    ``paths``. Ids are kept when unique across the files, else each is prefixed ``<k>/`` with the
    file's position in ``paths``.
    """
    if not paths:
        raise TraceError("load_traces: no trace files given")
    loaded = [_read(Path(p), format) for p in paths]
    if len(loaded) == 1:
        return loaded[0].requests  # already sorted, unique and rebased
    walls = [t.wall_origin_ns for t in loaded if t.wall_origin_ns is not None]
    base_ns = min(walls) if walls else 0
    merged: list[tuple[float, int, int, TraceRequest]] = []
    for k, trace in enumerate(loaded):
        offset_ms = 0.0 if trace.wall_origin_ns is None else (trace.wall_origin_ns - base_ns) / 1e6
        merged.extend((r.arrival_ms + offset_ms, k, i, r) for i, r in enumerate(trace.requests))
    merged.sort(key=lambda e: (e[0], e[1], e[2]))
    ids = [r.req_id for _t, _k, _i, r in merged]
    prefix = len(set(ids)) != len(ids)
    origin = merged[0][0]
    return [
        replace(r, arrival_ms=t - origin, req_id=f"{k}/{r.req_id}" if prefix else r.req_id) for t, k, _i, r in merged
    ]


# --------------------------------------------------------------------------------------------
# Transforms (pure: they return new lists)


def _rebased(requests: Sequence[TraceRequest]) -> list[TraceRequest]:
    if not requests:
        return []
    origin = requests[0].arrival_ms
    if origin == 0.0:
        return list(requests)
    return [replace(r, arrival_ms=r.arrival_ms - origin) for r in requests]


def window(requests: Sequence[TraceRequest], start_s: float, duration_s: float | None) -> list[TraceRequest]:
    """Requests arriving in [start_s, start_s + duration_s) (to the end if duration_s is None),
    rebased so the first kept request arrives at 0.0. An empty window is an error."""
    if not _is_number(start_s) or start_s < 0:
        raise TraceError(f"window start must be a non-negative number of seconds, got {start_s!r}")
    if duration_s is not None and (not _is_number(duration_s) or duration_s <= 0):
        raise TraceError(f"window duration must be a positive number of seconds, got {duration_s!r}")
    lo = start_s * 1000.0
    hi = math.inf if duration_s is None else (start_s + duration_s) * 1000.0
    kept = [r for r in requests if lo <= r.arrival_ms < hi]
    if not kept:
        span = requests[-1].arrival_ms / 1000.0 if requests else 0.0
        end = "end" if duration_s is None else f"{start_s + duration_s:g} s"
        raise TraceError(f"window [{start_s:g} s, {end}) holds no requests; the trace's arrivals span 0-{span:g} s")
    return _rebased(kept)


def scale_rate(requests: Sequence[TraceRequest], factor: float) -> list[TraceRequest]:
    """Speed arrivals up by ``factor`` (2.0 = twice the request rate): arrival_ms / factor."""
    if not _is_number(factor) or factor <= 0:
        raise TraceError(f"rate factor must be a positive number, got {factor!r}")
    return [replace(r, arrival_ms=r.arrival_ms / factor) for r in requests]


def limit(requests: Sequence[TraceRequest], n: int) -> list[TraceRequest]:
    """The first ``n`` requests."""
    if not _is_int(n) or n < 1:
        raise TraceError(f"request limit must be a positive integer, got {n!r}")
    return list(requests[:n])


# --------------------------------------------------------------------------------------------
# SLO class assignment

_CLASS_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_RULE_FORMS = "'trace', 'fixed:NAME', 'mix:NAME=WEIGHT,...' or 'by-source:SOURCE=NAME,...'"


def _class_name(name: str, rule: str) -> str:
    if _CLASS_NAME.fullmatch(name) is None:
        raise TraceError(f"class rule {rule!r}: {name!r} is not a class name (letters, digits, '_', '.', '-')")
    return name


def _pairs(body: str, rule: str) -> list[tuple[str, str]]:
    """``a=x,b=y`` as [(a, x), (b, y)]; keys must be unique."""
    pairs: list[tuple[str, str]] = []
    for item in body.split(","):
        key, eq, value = (part.strip() for part in item.partition("="))
        if not eq or not key or not value:
            raise TraceError(f"class rule {rule!r}: expected KEY=VALUE, got {item.strip()!r}")
        if any(key == k for k, _v in pairs):
            raise TraceError(f"class rule {rule!r}: {key!r} is given twice")
        pairs.append((key, value))
    return pairs


def _mix_weights(body: str, rule: str) -> tuple[list[str], np.ndarray[Any, np.dtype[np.float64]]]:
    names: list[str] = []
    weights: list[float] = []
    for name, text in _pairs(body, rule):
        try:
            weight = float(text)
        except ValueError:
            weight = math.nan
        if not math.isfinite(weight) or weight <= 0:
            raise TraceError(f"class rule {rule!r}: weight of {name!r} must be a positive number, got {text!r}")
        names.append(_class_name(name, rule))
        weights.append(weight)
    cumulative = np.cumsum(np.asarray(weights, dtype=np.float64))
    return names, cumulative / cumulative[-1]


def assign_classes(requests: Sequence[TraceRequest], rule: str, seed: int) -> list[TraceRequest]:
    """Set each request's ``slo_class`` by ``rule``:

    * ``trace``: keep the trace's class (None = the scheduler's default class);
    * ``fixed:NAME``: every request gets NAME;
    * ``mix:interactive=0.2,standard=0.6,batch=0.2``: independent draws with these (normalised,
      positive) weights, seeded by ``seed``;
    * ``by-source:code=interactive,conv=standard``: by ``source``; every source present must be
      mapped.
    """
    if not _is_int(seed) or seed < 0:
        raise TraceError(f"class seed must be a non-negative integer, got {seed!r}")
    kind, colon, body = rule.partition(":")
    kind = kind.strip()
    if rule.strip() == "trace":
        return list(requests)
    if kind == "fixed" and colon:
        name = _class_name(body.strip(), rule)
        return [replace(r, slo_class=name) for r in requests]
    if kind == "mix" and colon:
        names, cumulative = _mix_weights(body, rule)
        draws = np.random.default_rng(seed).random(len(requests))
        picks = np.minimum(np.searchsorted(cumulative, draws, side="right"), len(names) - 1)
        return [replace(r, slo_class=names[int(k)]) for r, k in zip(requests, picks)]
    if kind == "by-source" and colon:
        mapping = {src: _class_name(name, rule) for src, name in _pairs(body, rule)}
        unmapped = sorted({r.source for r in requests} - mapping.keys())
        if unmapped:
            present = ", ".join(sorted({repr(r.source) for r in requests}))
            raise TraceError(
                f"class rule {rule!r} maps no class for source(s) {', '.join(map(repr, unmapped))} "
                f"(sources in the trace: {present})"
            )
        return [replace(r, slo_class=mapping[r.source]) for r in requests]
    raise TraceError(f"unknown class rule {rule!r}; expected {_RULE_FORMS}")
