"""Reasoning (thinking/answer) lengths for traces that record none. This module owns the ServeGen
DeepSeek-R1 length model and its use, following the shared traces folder's ``REASONING.md`` §2
"Preferred": pick a client-window (one client's 6-h distribution window, weighted by the requests
that client sent in it), sample the output length and the reasoning ratio independently from that
client-window's PMFs, and split ``thinking = round(output * ratio)``, ``answer = output - thinking``.
Its invariant: every split it produces has ``think >= 0``, ``answer >= 1`` and
``think + answer == num_output_tokens``, and the same seed always gives the same lengths. Results
built this way are "real arrivals + production-derived reasoning lengths", never a real reasoning
trace; ``describe`` gives the sentence to print with them.
"""

from __future__ import annotations

import ast
import functools
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from meridian.errors import TraceError
from meridian.replay.traces import TraceRequest

__all__ = [
    "BUNDLED_SUMMARY",
    "DEFAULT_SERVEGEN_DIR",
    "REASONING_SOURCES",
    "SUMMARY_FORMAT",
    "ClientWindow",
    "Pmf",
    "ServeGenLengths",
    "apply_reasoning_lengths",
    "coarsen_pmf",
    "describe",
    "servegen_dir",
    "split_output",
    "write_summary",
]

#: Values of ``apply_reasoning_lengths(source=...)``.
REASONING_SOURCES = ("trace", "none", "servegen", "servegen-ratio")
#: ServeGen's distribution windows are 6 h; its rate rows are 10 min.
DATASET_WINDOW_S = 21_600
RATE_ROW_S = 600
DAY_S = 86_400
SUMMARY_FORMAT = "meridian-servegen-summary/1"
#: Masses in a summary are integers summing to this per PMF.
SUMMARY_MASS_UNITS = 1_000_000
BUNDLED_SUMMARY = Path(__file__).resolve().parent / "data" / "servegen_deepseek_r1.json"
CITATION = "ServeGen DeepSeek-R1 (Alibaba Bailian, arXiv:2505.09999, Apache-2.0)"

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def _repo_root() -> Path | None:
    """The checkout holding this file (also found from a venv inside it), or None when installed
    elsewhere."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "pyproject.toml").is_file() and (parent / "python" / "meridian").is_dir():
            return parent
    return None


def _default_servegen_dir() -> Path:
    # The shared trace folder sits beside the checkout: <root>/../shared/traces/servegen_deepseek_r1.
    root = _repo_root() or Path(__file__).resolve().parents[3]
    return root.parent / "shared" / "traces" / "servegen_deepseek_r1"


#: The full ServeGen folder next to the checkout; ``servegen_dir()`` also honours the environment.
DEFAULT_SERVEGEN_DIR = _default_servegen_dir()


def servegen_dir() -> Path:
    """``$MERIDIAN_SERVEGEN_DIR`` when set, else ``DEFAULT_SERVEGEN_DIR`` (which may not exist)."""
    override = os.environ.get("MERIDIAN_SERVEGEN_DIR", "").strip()
    return Path(override) if override else DEFAULT_SERVEGEN_DIR


# --------------------------------------------------------------------------------------------
# Distributions


@dataclass(frozen=True, eq=False)
class Pmf:
    """A discrete distribution: sorted distinct ``values`` with positive ``probs`` summing to 1, and
    ``cdf`` (its last entry exactly 1.0, so a draw in [0, 1) always lands on a value)."""

    values: FloatArray
    probs: FloatArray
    cdf: FloatArray

    @classmethod
    def from_masses(cls, values: npt.ArrayLike, masses: npt.ArrayLike) -> Pmf:
        """Sorted, duplicates merged, zero masses dropped, normalised. Masses must be >= 0, total > 0."""
        vals = np.asarray(values, dtype=np.float64)
        mass = np.asarray(masses, dtype=np.float64)
        if vals.shape != mass.shape or vals.ndim != 1:
            raise TraceError("a PMF needs as many masses as values")
        if not (np.all(np.isfinite(vals)) and np.all(np.isfinite(mass)) and np.all(mass >= 0)):
            raise TraceError("a PMF's values and masses must be finite and its masses >= 0")
        unique, inverse = np.unique(vals, return_inverse=True)
        merged = np.bincount(inverse, weights=mass, minlength=len(unique))
        keep = merged > 0
        unique, merged = unique[keep], merged[keep]
        if not len(unique):
            raise TraceError("a PMF needs positive total mass")
        probs = merged / merged.sum()
        cdf = np.cumsum(probs)
        cdf[-1] = 1.0
        return cls(values=unique, probs=probs, cdf=cdf)

    def mean(self) -> float:
        return float(np.dot(self.values, self.probs))

    def quantile(self, q: float) -> float:
        return float(self.values[min(int(np.searchsorted(self.cdf, q, side="left")), len(self.values) - 1)])


@dataclass(frozen=True, eq=False)
class ClientWindow:
    """One client's 6-h ServeGen window: its request count and its length PMFs."""

    client: int
    window_start_s: int  # 0, 21600, 43200 or 64800
    weight: float  # requests the client sent in the window (rate integrated over its 10-min rows)
    output_tokens: Pmf  # thinking + answer tokens
    reason_ratio: Pmf  # thinking / output


def _levels(max_points: int) -> FloatArray:
    """Bin edges in cumulative mass: equal-mass bins, the last of them split geometrically so
    the long upper tail keeps detail (a single 1/N bin would swallow the p99 region)."""
    tail = max_points // 8
    body = max_points - tail
    uniform = np.arange(1, body, dtype=np.float64) / body
    geometric = 1.0 - (1.0 / body) * 0.5 ** np.arange(1, tail + 1, dtype=np.float64)
    return np.concatenate([uniform, geometric])


def coarsen_pmf(pmf: Pmf, max_points: int) -> Pmf:
    """At most ``max_points`` points: adjacent values are grouped by where their cumulative mass
    starts (see ``_levels``) and each group becomes one point at its mass-weighted mean. Total mass
    and the mean are preserved exactly; quantiles move by at most one group."""
    if max_points < 2:
        raise TraceError(f"max_points must be at least 2, got {max_points}")
    if len(pmf.values) <= max_points:
        return pmf
    starts = pmf.cdf - pmf.probs
    groups = np.searchsorted(_levels(max_points), starts, side="right")
    mass = np.bincount(groups, weights=pmf.probs)
    moment = np.bincount(groups, weights=pmf.probs * pmf.values)
    used = mass > 0
    return Pmf.from_masses(moment[used] / mass[used], mass[used])


# --------------------------------------------------------------------------------------------
# The length model


class ServeGenLengths:
    """ServeGen DeepSeek-R1 client-windows, ready for fast seeded sampling.

    Client-windows without data, or whose client sent no request in that window (weight 0), are
    left out: they can never be drawn.
    """

    def __init__(self, windows: Sequence[ClientWindow], *, origin: str, max_points: int | None = None) -> None:
        if not windows:
            raise TraceError(f"{origin}: no client-window with data and a positive request rate")
        self.windows: tuple[ClientWindow, ...] = tuple(windows)
        self.origin = origin  # where it was loaded from, for messages
        self.max_points = max_points  # PMFs coarsened to this many points (None: as released)
        weights = np.asarray([w.weight for w in self.windows], dtype=np.float64)
        slots = np.asarray([_slot_of_start(w.window_start_s, origin) for w in self.windows], dtype=np.int64)
        self._pickers: dict[int | None, tuple[IntArray, FloatArray]] = {None: _picker(np.arange(len(weights)), weights)}
        for slot in range(DAY_S // DATASET_WINDOW_S):
            members = np.flatnonzero(slots == slot)
            if len(members):
                self._pickers[slot] = _picker(members, weights)
        self._output = _FlatPmfs([w.output_tokens for w in self.windows])
        self._ratio = _FlatPmfs([w.reason_ratio for w in self.windows])

    # ---- loading

    @classmethod
    def load(cls, path: str | Path) -> ServeGenLengths:
        """From a summary JSON file (``write_summary``), or a folder of ServeGen's
        ``chunk-<id>-dataset.json`` / ``chunk-<id>-trace.csv`` files (directly in it, or under
        ``data/reason/deepseek-r1/`` of a ServeGen checkout)."""
        path = Path(path)
        if path.is_file():
            return _load_summary(path)
        if path.is_dir():
            return _load_folder(_chunk_dir(path))
        raise TraceError(f"{path}: no such ServeGen folder or summary file")

    @classmethod
    def default(cls) -> ServeGenLengths:
        """The summary bundled with Meridian (works without the shared folder, e.g. in CI)."""
        return _bundled()

    # ---- sampling

    def sample(self, rng: np.random.Generator, hour_of_day: float | None = None) -> tuple[int, int]:
        """(num_think_tokens, num_answer_tokens) of one request; with ``hour_of_day`` (0 <= h < 24)
        the client-window is drawn from that 6-h window only. Uses three draws of ``rng``."""
        think, answer = self.sample_many(rng, 1, hour_of_day)
        return int(think[0]), int(answer[0])

    def sample_many(
        self, rng: np.random.Generator, n: int, hour_of_day: float | None = None
    ) -> tuple[IntArray, IntArray]:
        """``n`` samples at once; identical to ``n`` successive ``sample`` calls on the same ``rng``."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise TraceError(f"number of samples must be a non-negative integer, got {n!r}")
        slot = None if hour_of_day is None else _slot_of_hour(hour_of_day)
        output, ratio = self.draw(rng.random((n, 3)), np.full(n, -1 if slot is None else slot, dtype=np.int64))
        return split_output(output, ratio)

    def draw(self, uniforms: FloatArray, slots: IntArray) -> tuple[IntArray, FloatArray]:
        """(output tokens, reason ratio) per row of ``uniforms`` (n x 3 in [0, 1): client-window,
        output, ratio); ``slots[i]`` is the 6-h window index (0-3) or -1 for any."""
        picked = np.empty(len(uniforms), dtype=np.int64)
        for slot in np.unique(slots):
            rows = slots == slot
            key = None if slot < 0 else int(slot)
            if key not in self._pickers:
                raise TraceError(f"{self.origin}: no client-window has data in 6-h window {int(slot)}")
            members, cumulative = self._pickers[key]
            hit = np.minimum(np.searchsorted(cumulative, uniforms[rows, 0], side="right"), len(members) - 1)
            picked[rows] = members[hit]
        output = np.rint(self._output.draw(picked, uniforms[:, 1])).astype(np.int64)
        return output, self._ratio.draw(picked, uniforms[:, 2])


def _picker(members: IntArray, weights: FloatArray) -> tuple[IntArray, FloatArray]:
    cumulative = np.cumsum(weights[members])
    cumulative /= cumulative[-1]
    cumulative[-1] = 1.0
    return members.astype(np.int64), cumulative


class _FlatPmfs:
    """Many PMFs in one array so a vectorised draw can use one ``searchsorted``: PMF k's cdf is
    shifted by k, so entries stay increasing across PMFs and k + u lands inside PMF k."""

    def __init__(self, pmfs: Sequence[Pmf]) -> None:
        self.values = np.concatenate([p.values for p in pmfs])
        self.shifted = np.concatenate([p.cdf + k for k, p in enumerate(pmfs)])
        sizes = np.asarray([len(p.values) for p in pmfs], dtype=np.int64)
        self.ends = np.cumsum(sizes)

    def draw(self, which: IntArray, u: FloatArray) -> FloatArray:
        position = np.searchsorted(self.shifted, which + u, side="right")
        # k + u can round up to k + 1 for u within 1e-16 of 1; stay inside PMF k regardless.
        position = np.minimum(position, self.ends[which] - 1)
        return self.values[position]


def split_output(output: IntArray, ratio: FloatArray) -> tuple[IntArray, IntArray]:
    """think = round(output * ratio) (half to even, like Python's round), clamped so answer >= 1."""
    think = np.clip(np.rint(output * ratio).astype(np.int64), 0, output - 1)
    return think, output - think


def _slot_of_hour(hour_of_day: float) -> int:
    if (
        isinstance(hour_of_day, bool)
        or not isinstance(hour_of_day, (int, float))
        or not math.isfinite(hour_of_day)
        or not 0 <= hour_of_day < 24
    ):
        raise TraceError(f"hour_of_day must be a number in [0, 24), got {hour_of_day!r}")
    return int(hour_of_day // (DATASET_WINDOW_S / 3600))


def _slot_of_start(window_start_s: int, origin: str) -> int:
    if window_start_s % DATASET_WINDOW_S or not 0 <= window_start_s < DAY_S:
        raise TraceError(f"{origin}: window start {window_start_s} s is not one of ServeGen's 6-h windows")
    return window_start_s // DATASET_WINDOW_S


# --------------------------------------------------------------------------------------------
# ServeGen's released files

_CHUNK = re.compile(r"chunk-(\d+)-dataset\.json")


def _chunk_dir(folder: Path) -> Path:
    """The shared folder holds the files directly; a ServeGen checkout has them deeper."""
    candidates = [folder, folder / "deepseek-r1", folder / "data" / "reason" / "deepseek-r1"]
    for candidate in candidates:
        if any(_CHUNK.fullmatch(p.name) for p in candidate.glob("chunk-*-dataset.json")):
            return candidate
    looked = ", ".join(str(c) for c in candidates)
    raise TraceError(f"{folder}: no ServeGen chunk-<id>-dataset.json files (looked in {looked})")


def _load_folder(folder: Path) -> ServeGenLengths:
    clients = sorted(int(m.group(1)) for p in folder.iterdir() if (m := _CHUNK.fullmatch(p.name)))
    windows: list[ClientWindow] = []
    for client in clients:
        requests = _window_requests(folder / f"chunk-{client}-trace.csv")
        for start, (output, ratio) in _read_dataset(folder / f"chunk-{client}-dataset.json").items():
            weight = requests.get(start, 0.0)
            if weight > 0:
                windows.append(ClientWindow(client, start, weight, output, ratio))
    return ServeGenLengths(windows, origin=str(folder))


def _window_requests(path: Path) -> dict[int, float]:
    """Requests per 6-h window: the sum of rate x 600 s over the window's 10-min rows."""
    if not path.is_file():
        raise TraceError(f"{path}: missing (every chunk-<id>-dataset.json needs its trace CSV)")
    totals: dict[int, float] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split(",")
        try:
            start, rate = int(fields[0]), float(fields[1])
        except (ValueError, IndexError):
            raise TraceError(f"{path}:{lineno}: expected 'window_start_s,rate,...', got {line!r}") from None
        if not math.isfinite(rate) or rate < 0 or not 0 <= start < DAY_S:
            raise TraceError(f"{path}:{lineno}: window start {start} or rate {rate} out of range")
        slot_start = start - start % DATASET_WINDOW_S
        totals[slot_start] = totals.get(slot_start, 0.0) + rate * RATE_ROW_S
    return totals


def _read_dataset(path: Path) -> dict[int, tuple[Pmf, Pmf]]:
    """{window start: (output PMF, ratio PMF)} of the non-empty windows. Input lengths are not
    parsed: nothing here uses them."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(document, dict):
        raise TraceError(f"{path}: expected a JSON object keyed by window start")
    windows: dict[int, tuple[Pmf, Pmf]] = {}
    for key, fields in document.items():
        where = f"{path}: window {key!r}"
        if not isinstance(key, str) or not key.isdigit() or not isinstance(fields, dict):
            raise TraceError(f"{where}: expected a window start in seconds mapping to the PMF fields")
        output = _literal_pmf(fields, "output_tokens", where)
        ratio = _literal_pmf(fields, "reason_ratio", where)
        if output is None or ratio is None:
            continue  # the client was idle in this window
        if output.values[0] < 1 or np.any(output.values != np.rint(output.values)):
            raise TraceError(f"{where}: 'output_tokens' values must be positive integers")
        if ratio.values[0] < 0 or ratio.values[-1] > 1:
            raise TraceError(f"{where}: 'reason_ratio' values must lie in [0, 1]")
        windows[int(key)] = (output, ratio)
    return windows


def _literal_pmf(fields: dict[str, Any], name: str, where: str) -> Pmf | None:
    """A PMF from a string holding a Python dict literal (ServeGen's format; not JSON, since its
    keys are bare numbers). None for an empty dict."""
    text = fields.get(name)
    if not isinstance(text, str):
        raise TraceError(f"{where}: missing {name!r} (a string holding a dict literal)")
    try:
        table = ast.literal_eval(text)
    except (ValueError, SyntaxError) as exc:
        raise TraceError(f"{where}: {name!r} is not a Python dict literal ({exc})") from None
    if not isinstance(table, dict) or not all(_is_number(k) and _is_number(v) for k, v in table.items()):
        raise TraceError(f"{where}: {name!r} must map numbers to probabilities")
    if not table:
        return None
    try:
        return Pmf.from_masses(list(table.keys()), list(table.values()))
    except TraceError as exc:
        raise TraceError(f"{where}: {name!r}: {exc}") from None


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# --------------------------------------------------------------------------------------------
# The summary file (bundled for CI)


def _integer_masses(probs: FloatArray) -> list[int]:
    """Largest-remainder rounding to integers that sum to exactly SUMMARY_MASS_UNITS."""
    scaled = probs * SUMMARY_MASS_UNITS
    floors = np.floor(scaled).astype(np.int64)
    short = SUMMARY_MASS_UNITS - int(floors.sum())
    floors[np.argsort(-(scaled - floors), kind="stable")[:short]] += 1
    return [int(m) for m in floors]


def _summary_pmf(pmf: Pmf, max_points: int | None, decimals: int | None) -> dict[str, list[Any]]:
    small = pmf if max_points is None else coarsen_pmf(pmf, max_points)
    values = (
        np.rint(small.values).astype(np.int64).tolist()
        if decimals is None
        else np.round(small.values, decimals).tolist()
    )
    return {"values": values, "masses": _integer_masses(small.probs)}


SUMMARY_DERIVATION = (
    "Per client-window (one client's 6-h window): weight = requests sent (sum of rate x 600 s over the "
    "window's 10-min rows of chunk-<id>-trace.csv); output_tokens and reason_ratio PMFs from "
    "chunk-<id>-dataset.json (input_tokens omitted). Client-windows with empty PMFs or zero requests "
    "are left out. PMFs with more than max_points points are coarsened: points are grouped by where "
    "their cumulative mass starts (equal-mass groups, the last one split geometrically 1/2, 1/4, ... "
    "to keep the upper tail) and each group is replaced by its mass-weighted mean, so total mass and "
    "mean are preserved; output values are then rounded to integers, ratios to 4 decimals, and masses "
    "stored as integers summing to 1,000,000 per PMF (largest-remainder rounding)."
)


def write_summary(lengths: ServeGenLengths, path: str | Path, max_points: int | None = 64) -> None:
    """Write ``lengths`` as one JSON file that ``ServeGenLengths.load`` reads back. One
    client-window per line, so the file diffs well."""
    # Coarsening an already coarsened summary again can only lower its resolution.
    points = [p for p in (max_points, lengths.max_points) if p is not None]
    header = {
        "format": SUMMARY_FORMAT,
        "source": "alibaba/ServeGen data/reason/deepseek-r1/ @ f891d1189eb32b3868dfc443800c4150548c282a "
        "(Apache-2.0); Xiang et al., arXiv:2505.09999",
        "derived_from": Path(lengths.origin).name + ("" if lengths.max_points is None else " (already coarsened)"),
        "derivation": SUMMARY_DERIVATION,
        "max_points": min(points) if points else None,
    }
    rows = [
        json.dumps(
            {
                "client": w.client,
                "window_start_s": w.window_start_s,
                "weight": round(w.weight, 3),
                "output_tokens": _summary_pmf(w.output_tokens, max_points, None),
                "reason_ratio": _summary_pmf(w.reason_ratio, max_points, 4),
            },
            separators=(",", ":"),
        )
        for w in lengths.windows
    ]
    head = json.dumps(header, indent=1)[:-2]  # reopen the object to append the windows
    text = head + ',\n "client_windows": [\n' + ",\n".join(rows) + "\n ]\n}\n"
    Path(path).write_text(text, encoding="utf-8")


def _load_summary(path: Path) -> ServeGenLengths:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(document, dict) or document.get("format") != SUMMARY_FORMAT:
        raise TraceError(f'{path}: not a ServeGen summary (expected "format": {SUMMARY_FORMAT!r})')
    windows = []
    for index, entry in enumerate(document.get("client_windows") or []):
        where = f"{path}: client_windows[{index}]"
        try:
            windows.append(
                ClientWindow(
                    client=int(entry["client"]),
                    window_start_s=int(entry["window_start_s"]),
                    weight=float(entry["weight"]),
                    output_tokens=Pmf.from_masses(entry["output_tokens"]["values"], entry["output_tokens"]["masses"]),
                    reason_ratio=Pmf.from_masses(entry["reason_ratio"]["values"], entry["reason_ratio"]["masses"]),
                )
            )
        except TraceError as exc:
            raise TraceError(f"{where}: {exc}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceError(f"{where}: malformed ({exc!r})") from None
        if not windows[-1].weight > 0:
            raise TraceError(f"{where}: 'weight' must be positive")
    max_points = document.get("max_points")
    return ServeGenLengths(windows, origin=str(path), max_points=max_points if isinstance(max_points, int) else None)


@functools.cache
def _bundled() -> ServeGenLengths:
    return _load_summary(BUNDLED_SUMMARY)


# --------------------------------------------------------------------------------------------
# Applying lengths to a trace


def apply_reasoning_lengths(
    requests: Sequence[TraceRequest],
    source: str,
    *,
    seed: int,
    servegen: ServeGenLengths | None,
    hour_of_day: float | None = None,
) -> list[TraceRequest]:
    """Give every request its thinking/answer split by ``source``:

    * ``trace``: keep the trace's split; every request must have one.
    * ``none``: non-reasoning requests: no split (``num_think_tokens`` = ``num_answer_tokens`` = None,
      all ``num_output_tokens`` are answer tokens); a split in the trace is dropped.
    * ``servegen``: replace each request's output length and split with a ServeGen sample
      (``num_output_tokens`` = think + answer).
    * ``servegen-ratio``: keep the trace's ``num_output_tokens`` and split it by a sampled
      reasoning ratio (answer >= 1).

    The ServeGen modes resample every request, even one whose trace has a split. ``servegen`` None
    means the bundled summary. With ``hour_of_day`` (the first request's hour, 0 <= h < 24) each
    request draws from the 6-h window its own arrival falls in (the hour advances with arrival_ms
    and wraps at 24). Both ServeGen modes use the same draws per request, so request i gets the same
    ratio under either. Same seed, same result.
    """
    if source not in REASONING_SOURCES:
        raise TraceError(f"unknown reasoning source {source!r}; expected one of {', '.join(REASONING_SOURCES)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise TraceError(f"reasoning seed must be a non-negative integer, got {seed!r}")
    if source == "trace":
        return _keep_trace_split(requests)
    if source == "none":
        return [replace(r, num_think_tokens=None, num_answer_tokens=None) for r in requests]
    lengths = servegen if servegen is not None else ServeGenLengths.default()
    uniforms = np.random.default_rng(seed).random((len(requests), 3))
    output, ratio = lengths.draw(uniforms, _request_slots(requests, hour_of_day))
    if source == "servegen-ratio":
        output = np.asarray([r.num_output_tokens for r in requests], dtype=np.int64)
    think, answer = split_output(output, ratio)
    return [
        replace(r, num_output_tokens=int(t + a), num_think_tokens=int(t), num_answer_tokens=int(a))
        for r, t, a in zip(requests, think, answer)
    ]


def _keep_trace_split(requests: Sequence[TraceRequest]) -> list[TraceRequest]:
    for r in requests:
        if not r.has_split:
            raise TraceError(
                f"reasoning source 'trace' needs a thinking/answer split in the trace, but request "
                f"{r.req_id!r} (source {r.source!r}) has none; use 'servegen' or 'servegen-ratio'"
            )
    return list(requests)


def _request_slots(requests: Sequence[TraceRequest], hour_of_day: float | None) -> IntArray:
    if hour_of_day is None:
        return np.full(len(requests), -1, dtype=np.int64)
    _slot_of_hour(hour_of_day)  # validates
    arrivals_h = np.asarray([r.arrival_ms for r in requests], dtype=np.float64) / 3_600_000.0
    hours = np.mod(hour_of_day + arrivals_h, 24.0)
    return np.minimum(hours // (DATASET_WINDOW_S / 3600), 3).astype(np.int64)


def describe(source: str, seed: int, servegen: ServeGenLengths | None = None) -> str:
    """One line for a report saying where the reasoning lengths came from."""
    if source in ("servegen", "servegen-ratio"):
        lengths = servegen if servegen is not None else ServeGenLengths.default()
        points = lengths.max_points
        coarse = "" if points is None else f"; summary with PMFs coarsened to <= {points} points"
    if source == "trace":
        return "thinking/answer lengths as recorded in the trace"
    if source == "none":
        return "no reasoning: every request's output is answer tokens (no thinking phase)"
    if source == "servegen":
        return (
            f"real arrivals + production-derived reasoning lengths: {CITATION}, output length and "
            f"reasoning ratio sampled independently within a client-window, seed {seed}{coarse}"
        )
    if source == "servegen-ratio":
        return (
            f"real arrivals and output lengths + production-derived reasoning split: reasoning ratio "
            f"sampled from a {CITATION} client-window and applied to the trace's output length, "
            f"seed {seed}{coarse}"
        )
    raise TraceError(f"unknown reasoning source {source!r}; expected one of {', '.join(REASONING_SOURCES)}")
