"""ServeGen-shaped arrival processes: this module owns ServeGen's per-client arrival rows (the
10-minute rows of ``chunk-<id>-trace.csv``: rate, coefficient of variation of the gaps, Gamma or
Weibull shape) and turning a span of ServeGen's day into arrival times for a replay. Every client
active in the span is a renewal process whose gaps follow its row's distribution, rescaled to the
row's rate as ServeGen does; rates are thinned by one common factor so the span yields the number
of requests a scenario needs, which keeps each client's burstiness (its CV) and the day's shape
(rates rising and falling from row to row); the processes are superposed. Invariant: the same
(rows, span, count, seed) always gives the same arrivals; arrivals are sorted, start at 0.0 and
are finite, and there are exactly as many as asked for.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from meridian.errors import TraceError
from meridian.replay.reasoning import DAY_S, RATE_ROW_S, servegen_dir
from meridian.replay.traces import TraceRequest

__all__ = ["ARRIVALS_FORMAT", "BUNDLED_ARRIVALS", "RateRow", "ServeGenArrivals", "retime"]

ARRIVALS_FORMAT = "meridian-servegen-arrivals/1"
BUNDLED_ARRIVALS = Path(__file__).resolve().parent / "data" / "servegen_arrivals.json"
PATTERNS = ("Gamma", "Weibull")
#: Rates are thinned to this many times the requests asked for, so that a random shortfall of
#: the superposed process is rare; the first ``num_requests`` arrivals are kept.
_HEADROOM = 1.15

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class RateRow:
    """One client's 10-minute arrival row (an active one: an idle client has no row)."""

    client: int
    window_start_s: int  # multiple of 600 in [0, 86,400)
    rate: float  # requests/s, > 0
    cv: float  # coefficient of variation of the gaps, > 0
    pattern: str  # "Gamma" or "Weibull"
    shape: float  # the distribution's shape parameter, > 0 (its scale is set by ``rate``)

    def check(self, where: str) -> RateRow:
        problems = []
        if self.window_start_s % RATE_ROW_S or not 0 <= self.window_start_s < DAY_S:
            problems.append(f"window start {self.window_start_s} s is not a 10-minute row of the day")
        for name in ("rate", "cv", "shape"):
            value = getattr(self, name)
            if not (isinstance(value, float) and math.isfinite(value) and value > 0):
                problems.append(f"{name} must be a positive finite number, got {value!r}")
        if self.pattern not in PATTERNS:
            problems.append(f"pattern must be one of {', '.join(PATTERNS)}, got {self.pattern!r}")
        if problems:
            raise TraceError(f"{where}: {'; '.join(problems)}")
        return self

    def unit_gaps(self, rng: np.random.Generator, n: int) -> FloatArray:
        """``n`` gaps of this row's shape with mean 1 (ServeGen rescales sampled gaps to hit the
        rate; the shape alone sets the burstiness)."""
        if self.pattern == "Gamma":
            return rng.gamma(self.shape, 1.0 / self.shape, n)
        return rng.weibull(self.shape, n) / math.gamma(1.0 + 1.0 / self.shape)


class ServeGenArrivals:
    """ServeGen DeepSeek-R1's per-client arrival rows, ready to sample spans of the day from."""

    def __init__(self, rows: Sequence[RateRow], *, origin: str) -> None:
        if not rows:
            raise TraceError(f"{origin}: no active client row (every client idle all day)")
        self.rows = tuple(sorted(rows, key=lambda r: (r.window_start_s, r.client)))
        self.origin = origin

    # ---- loading

    @classmethod
    def load(cls, path: str | Path) -> ServeGenArrivals:
        """From a summary JSON file (``write_summary``) or a folder of ServeGen's
        ``chunk-<id>-trace.csv`` files."""
        path = Path(path)
        if path.is_file():
            return _load_summary(path)
        if path.is_dir():
            return _load_folder(path)
        raise TraceError(f"{path}: no such ServeGen folder or arrivals summary file")

    @classmethod
    def default(cls) -> ServeGenArrivals:
        """ServeGen's folder (``servegen_dir()``) when it is there, else the bundled summary (its
        rows as released, rounded to four significant digits)."""
        folder = servegen_dir()
        if any(folder.glob("chunk-*-trace.csv")):
            return _load_folder_cached(str(folder))
        return _bundled()

    # ---- queries

    def rows_in(self, start_s: float, span_s: float) -> list[tuple[RateRow, float, float]]:
        """The rows overlapping ``[start_s, start_s + span_s)`` of the day (wrapping past
        midnight), each with the overlap's start and end in seconds from ``start_s``."""
        _check_span(start_s, span_s)
        out = []
        for row in self.rows:
            # The row may overlap the span on this day and, when the span wraps, the next.
            for day in (0.0, DAY_S):
                lo = max(row.window_start_s + day, start_s)
                hi = min(row.window_start_s + day + RATE_ROW_S, start_s + span_s)
                if hi > lo:
                    out.append((row, lo - start_s, hi - start_s))
        return out

    def mean_rate(self, start_s: float, span_s: float) -> float:
        """All clients' requests per second over the span."""
        return sum(row.rate * (hi - lo) for row, lo, hi in self.rows_in(start_s, span_s)) / span_s

    def sample(self, start_s: float, span_s: float, num_requests: int, seed: int) -> FloatArray:
        """``num_requests`` arrival times (ms, sorted, the first at 0.0) shaped like ServeGen's
        traffic in ``[start_s, start_s + span_s)``: every client row a renewal process at its
        rate times one common factor (so that the span holds about the requests asked for), its
        gaps of the row's shape, the processes superposed; the first ``num_requests`` arrivals are
        kept, so a sample can end a little before the span does."""
        if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 1:
            raise TraceError(f"number of arrivals must be a positive integer, got {num_requests!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise TraceError(f"arrival seed must be a non-negative integer, got {seed!r}")
        rows = self.rows_in(start_s, span_s)
        expected = sum(row.rate * (hi - lo) for row, lo, hi in rows)
        if expected <= 0:
            raise TraceError(
                f"{self.origin}: no client is active in [{start_s:g} s, {start_s + span_s:g} s) of the day"
            )
        rng = np.random.default_rng(seed)
        thinning = _HEADROOM * num_requests / expected
        for _attempt in range(8):
            times = np.sort(np.concatenate([_renewal(rng, row, row.rate * thinning, lo, hi) for row, lo, hi in rows]))
            if len(times) >= num_requests:
                kept = times[:num_requests]
                return np.asarray((kept - kept[0]) * 1000.0, dtype=np.float64)
            thinning *= 1.5 * num_requests / max(len(times), 1)
        raise TraceError(
            f"{self.origin}: could not draw {num_requests} arrivals from [{start_s:g} s, "
            f"{start_s + span_s:g} s) of the day"
        )

    # ---- the bundled summary

    def write_summary(self, path: str | Path) -> None:
        """Writes the rows as one JSON file that ``load`` reads back (four significant digits)."""
        header = {
            "format": ARRIVALS_FORMAT,
            "source": "alibaba/ServeGen data/reason/deepseek-r1/ chunk-<id>-trace.csv @ "
            "f891d1189eb32b3868dfc443800c4150548c282a (Apache-2.0); Xiang et al., arXiv:2505.09999",
            "derivation": "Every active 10-minute row (non-empty pattern) of every client: window start, rate, "
            "cv, pattern and shape (ServeGen's p1) rounded to 4 significant digits; the scale "
            "(p2) is left out because gaps are rescaled to the rate.",
            "columns": ["client", "window_start_s", "rate", "cv", "pattern", "shape"],
        }
        rows = [
            json.dumps([r.client, r.window_start_s, _sig(r.rate), _sig(r.cv), r.pattern, _sig(r.shape)])
            for r in self.rows
        ]
        head = json.dumps(header, indent=1)[:-2]
        Path(path).write_text(head + ',\n "rows": [\n' + ",\n".join(rows) + "\n ]\n}\n", encoding="utf-8")


def _sig(value: float) -> float:
    return float(f"{value:.4g}")


def _check_span(start_s: float, span_s: float) -> None:
    if not (isinstance(start_s, (int, float)) and math.isfinite(start_s) and 0 <= start_s < DAY_S):
        raise TraceError(f"arrival span start must be a time of day in [0, {DAY_S}) s, got {start_s!r}")
    if not (isinstance(span_s, (int, float)) and math.isfinite(span_s) and 0 < span_s <= DAY_S):
        raise TraceError(f"arrival span must be in (0, {DAY_S}] s, got {span_s!r}")


def _renewal(rng: np.random.Generator, row: RateRow, rate: float, lo_s: float, hi_s: float) -> FloatArray:
    """One renewal process at ``rate`` over ``[lo_s, hi_s)``; it starts a uniform fraction of a
    gap into the interval (an approximation of the stationary start)."""
    expected = rate * (hi_s - lo_s)
    n = int(expected + 6.0 * math.sqrt(expected * max(row.cv, 1.0) ** 2 + 1.0) + 8)
    gaps = row.unit_gaps(rng, n) / rate
    gaps[0] *= rng.random()
    times = lo_s + np.cumsum(gaps)
    while times[-1] < hi_s:
        more = times[-1] + np.cumsum(row.unit_gaps(rng, n) / rate)
        times = np.concatenate([times, more])
    return times[times < hi_s]


def retime(requests: Sequence[TraceRequest], arrivals_ms: FloatArray) -> list[TraceRequest]:
    """The requests, in their order, at ``arrivals_ms`` (one per request, sorted)."""
    if len(arrivals_ms) != len(requests):
        raise TraceError(f"{len(arrivals_ms)} arrival times for {len(requests)} requests")
    if len(arrivals_ms) and (np.any(np.diff(arrivals_ms) < 0) or not np.all(np.isfinite(arrivals_ms))):
        raise TraceError("arrival times must be finite and sorted")
    return [replace(r, arrival_ms=float(t)) for r, t in zip(requests, arrivals_ms)]


# ---- ServeGen's files ---------------------------------------------------------------------------


def _load_folder(folder: Path) -> ServeGenArrivals:
    files = sorted(folder.glob("chunk-*-trace.csv"))
    if not files:
        raise TraceError(f"{folder}: no ServeGen chunk-<id>-trace.csv files")
    rows: list[RateRow] = []
    for path in files:
        try:
            client = int(path.name.split("-")[1])
        except ValueError:
            raise TraceError(f"{path}: expected a name chunk-<id>-trace.csv") from None
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            fields = line.strip().split(",")
            if len(fields) < 5 or not fields[3]:
                continue  # blank, or the client is idle in this row
            where = f"{path}:{lineno}"
            try:
                row = RateRow(client, int(fields[0]), float(fields[1]), float(fields[2]), fields[3], float(fields[4]))
            except ValueError:
                raise TraceError(
                    f"{where}: expected 'window_start_s,rate,cv,pattern,shape,scale', got {line!r}"
                ) from None
            if row.rate > 0:
                rows.append(row.check(where))
    return ServeGenArrivals(rows, origin=str(folder))


@functools.cache
def _load_folder_cached(folder: str) -> ServeGenArrivals:
    return _load_folder(Path(folder))


def _load_summary(path: Path) -> ServeGenArrivals:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(document, dict) or document.get("format") != ARRIVALS_FORMAT:
        raise TraceError(f'{path}: not a ServeGen arrivals summary (expected "format": {ARRIVALS_FORMAT!r})')
    rows = []
    for index, entry in enumerate(document.get("rows") or []):
        where = f"{path}: rows[{index}]"
        try:
            client, start, rate, cv, pattern, shape = entry
            rows.append(
                RateRow(int(client), int(start), float(rate), float(cv), str(pattern), float(shape)).check(where)
            )
        except (TypeError, ValueError) as exc:
            raise TraceError(f"{where}: malformed ({exc})") from None
    return ServeGenArrivals(rows, origin=str(path))


@functools.cache
def _bundled() -> ServeGenArrivals:
    return _load_summary(BUNDLED_ARRIVALS)
