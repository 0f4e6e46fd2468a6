"""Hardware/model profiles: the capacity and the step-time cost model that stand in for a GPU in
``meridian replay``.

A profile owns what the replay needs from a real deployment and nothing else: the capacity vLLM
would have on it (KV blocks, batch limits, context length) and the wall time of one engine step
as a function of the batch shape the scheduler produced (``StepBatch``). The time has one of two
forms, named by the profile's ``model`` key: ``roofline``, derived from hardware and model
constants that the profile file cites one by one (the two bundled profiles), or ``linear``,
fitted by ``fit_profile`` to the step timings Meridian's vLLM shim logs on a real engine. The
invariant: a ``Profile`` exists only after every field passed validation (types, ranges, no
unknown keys, a citation in ``sources`` for every number), and its step time is a non-decreasing
function of each of the three batch inputs, 0 for a step that schedules no tokens.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meridian.errors import InvalidArgumentError, ProfileError
from meridian.offline.engine import TransferCost
from meridian.replay.noise import StepNoise, fit_step_noise

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "LinearCost",
    "Profile",
    "RooflineCost",
    "RooflineTerms",
    "StepBatch",
    "available_profiles",
    "fit_profile",
    "step_noise_of_log",
]

BUNDLED_DIR = Path(__file__).parent / "profiles"

#: Lines at the start of a step log that ``fit_profile`` drops as warm-up by default.
DEFAULT_WARMUP_STEPS = 5
#: A step whose fit residual is further than this many robust standard deviations (1.4826 * MAD)
#: from the median residual is dropped as an outlier by ``fit_profile``.
DEFAULT_OUTLIER_MADS = 5.0


# --- the batch shape -------------------------------------------------------------------------


@dataclass(frozen=True)
class StepBatch:
    """The shape of one engine step, as Meridian's vLLM shim logs it (``step_shape``)."""

    num_prefill_tokens: int  # prompt tokens computed this step (chunks, incl. recompute after preemption)
    num_decode_requests: int  # requests decoding one token this step
    num_context_tokens: int  # KV tokens attention reads, summed over scheduled requests (incl. new ones)

    def __post_init__(self) -> None:
        for name in ("num_prefill_tokens", "num_decode_requests", "num_context_tokens"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise InvalidArgumentError(f"StepBatch.{name} must be a non-negative int, got {value!r}")

    @property
    def is_empty(self) -> bool:
        """No tokens scheduled: no forward pass runs."""
        return self.num_prefill_tokens == 0 and self.num_decode_requests == 0


# --- the two cost forms ----------------------------------------------------------------------


@dataclass(frozen=True)
class RooflineTerms:
    """The four roofline times (ms) of one step, before the per-phase ``max`` and the overhead."""

    dense_memory_ms: float
    dense_compute_ms: float
    attention_memory_ms: float
    attention_compute_ms: float


@dataclass(frozen=True)
class RooflineCost:
    """Step time from hardware and model constants.

    The roofline form charges a step its fixed overhead plus two phases, each bounded by its own
    roofline because they run as separate kernels one after the other (a single ``max`` over the
    whole step would let the attention's KV reads hide the GEMMs' arithmetic, which they cannot)::

        step_ms  = overhead_ms + dense_ms + attention_ms            (0 when P = D = 0)
        dense_ms = max(weight_bytes / BW,
                       (2 * active_params * (P + D) + 2 * lm_head_params * D) / F)
        attention_ms = max(kv_bytes_per_token * C / BW,
                           attn_flops_per_context_token * (C + P**2 / 2) / F)
        BW = hbm_bytes_per_s * mem_efficiency,  F = peak_flops * compute_efficiency

    with P = ``num_prefill_tokens``, D = ``num_decode_requests``, C = ``num_context_tokens`` and times
    in ms. ``attn_flops_per_context_token`` is the FLOPs of one (query token, context token) pair,
    4 * layers * q_heads * head_dim (QK^T and PV, a multiply-add each). The pairs a step computes are
    taken as C (one query per context token: exact for decode) plus P**2 / 2 (a prompt chunk's causal
    attention to itself). This undercounts a chunk's attention to context computed in earlier steps
    (later chunks of a long prompt, recompute after preemption) and overcounts several short prompts
    sharing one chunk; the three-number batch shape does not say which prompt tokens belong to which
    request. The LM head runs once per decoding request (prefill chunks that finish a prompt also
    sample one token; that row is left out).
    """

    overhead_ms: float  # fixed per-step cost: CPU scheduling and launch not hidden behind the GPU
    hbm_bytes_per_s: float  # peak HBM bandwidth
    mem_efficiency: float  # achieved fraction of it for weight and KV reads
    peak_flops: float  # peak dense BF16 tensor FLOP/s
    compute_efficiency: float  # achieved fraction of it (MFU) for GEMMs and attention
    weight_bytes: int  # bytes of weights read each step (all but the embedding table)
    kv_bytes_per_token: int  # K and V bytes per token over all layers
    active_params: int  # parameters multiplied per token (non-embedding)
    lm_head_params: int  # parameters of the LM head, applied once per decoding request
    attn_flops_per_context_token: int  # FLOPs per (query token, context token) pair

    def terms(self, batch: StepBatch) -> RooflineTerms:
        bandwidth = self.hbm_bytes_per_s * self.mem_efficiency
        flops = self.peak_flops * self.compute_efficiency
        p, d, c = batch.num_prefill_tokens, batch.num_decode_requests, batch.num_context_tokens
        dense_flops = 2.0 * self.active_params * (p + d) + 2.0 * self.lm_head_params * d
        attention_pairs = c + p * p / 2.0
        return RooflineTerms(
            dense_memory_ms=self.weight_bytes / bandwidth * 1e3,
            dense_compute_ms=dense_flops / flops * 1e3,
            attention_memory_ms=self.kv_bytes_per_token * c / bandwidth * 1e3,
            attention_compute_ms=self.attn_flops_per_context_token * attention_pairs / flops * 1e3,
        )

    def step_ms(self, batch: StepBatch) -> float:
        if batch.is_empty:
            return 0.0
        t = self.terms(batch)
        dense = max(t.dense_memory_ms, t.dense_compute_ms)
        attention = max(t.attention_memory_ms, t.attention_compute_ms)
        return self.overhead_ms + dense + attention


@dataclass(frozen=True)
class LinearCost:
    """Step time linear in the batch shape, with non-negative coefficients (``fit_profile``)."""

    base_ms: float
    per_prefill_token_ms: float
    per_decode_request_ms: float
    per_context_token_ms: float

    def step_ms(self, batch: StepBatch) -> float:
        if batch.is_empty:
            return 0.0
        return (
            self.base_ms
            + self.per_prefill_token_ms * batch.num_prefill_tokens
            + self.per_decode_request_ms * batch.num_decode_requests
            + self.per_context_token_ms * batch.num_context_tokens
        )


Cost = RooflineCost | LinearCost


# --- field specifications --------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    """How one profile key is checked: its kind and, for numbers, the allowed range."""

    kind: str  # "int", "number", "str", "str_map", "list"
    low: float | None = None  # numbers: lower bound
    low_inclusive: bool = False
    high: float | None = None  # numbers: inclusive upper bound
    required: bool = True

    def describe(self) -> str:
        if self.kind not in ("int", "number"):
            return {"str": "a non-empty string", "str_map": "an object of strings", "list": "a list"}[self.kind]
        if self.high is not None:
            return f"a number in {'[' if self.low_inclusive else '('}{self.low}, {self.high}]"
        return f"a {'non-negative' if self.low_inclusive else 'positive'} {self.kind}"


_POS_INT = _Spec("int", low=0)
_NONNEG_INT = _Spec("int", low=0, low_inclusive=True)
_POS_NUM = _Spec("number", low=0)
_NONNEG_NUM = _Spec("number", low=0, low_inclusive=True)
_FRACTION = _Spec("number", low=0, high=1.0)

CAPACITY_KEYS: dict[str, _Spec] = {
    "block_size": _POS_INT,
    "num_kv_blocks": _POS_INT,
    "max_num_seqs": _POS_INT,
    "max_num_batched_tokens": _POS_INT,
    "max_model_len": _POS_INT,
}
#: The host KV tier's link, and the link a prefill/decode hand-off reads over (optional: a
#: profile without one cannot model the tier, or prices hand-offs only from the replay's flags).
TIER_KEYS: dict[str, _Spec] = {
    "host_link_bytes_per_s": _Spec("number", low=0, required=False),
    "pd_link_bytes_per_s": _Spec("number", low=0, required=False),
    "pd_link_latency_ms": _Spec("number", low=0, required=False),
}
META_KEYS: dict[str, _Spec] = {
    "name": _Spec("str"),
    "description": _Spec("str"),
    "model": _Spec("str"),
    "sources": _Spec("str_map"),
    "derivation": _Spec("str_map", required=False),
    "validation": _Spec("list", required=False),
}
ROOFLINE_KEYS: dict[str, _Spec] = {
    "overhead_ms": _NONNEG_NUM,
    "hbm_bytes_per_s": _POS_NUM,
    "mem_efficiency": _FRACTION,
    "peak_flops": _POS_NUM,
    "compute_efficiency": _FRACTION,
    "weight_bytes": _POS_INT,
    "kv_bytes_per_token": _POS_INT,
    "active_params": _POS_INT,
    "lm_head_params": _NONNEG_INT,
    "attn_flops_per_context_token": _NONNEG_INT,
}
LINEAR_KEYS: dict[str, _Spec] = {
    "base_ms": _NONNEG_NUM,
    "per_prefill_token_ms": _NONNEG_NUM,
    "per_decode_request_ms": _NONNEG_NUM,
    "per_context_token_ms": _NONNEG_NUM,
}
COST_KEYS: dict[str, dict[str, _Spec]] = {"roofline": ROOFLINE_KEYS, "linear": LINEAR_KEYS}
COST_TYPES: dict[str, type[RooflineCost] | type[LinearCost]] = {"roofline": RooflineCost, "linear": LinearCost}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _check_value(source: str, key: str, value: object, spec: _Spec) -> None:
    """Raises ``ProfileError`` naming ``source`` and ``key`` unless ``value`` fits ``spec``."""
    ok: bool
    if spec.kind == "int":
        ok = _is_int(value)
    elif spec.kind == "number":
        ok = _is_number(value)
    elif spec.kind == "str":
        ok = isinstance(value, str) and bool(value.strip())
    elif spec.kind == "str_map":
        ok = isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
    else:
        ok = isinstance(value, list)
    if ok and isinstance(value, (int, float)) and spec.kind in ("int", "number"):
        number = float(value)
        if spec.low is not None:
            ok = number >= spec.low if spec.low_inclusive else number > spec.low
        if ok and spec.high is not None:
            ok = number <= spec.high
    if not ok:
        raise ProfileError(f"profile {source}: key {key!r} must be {spec.describe()}, got {value!r}")


def _check_keys(source: str, data: Mapping[str, Any], specs: Mapping[str, _Spec]) -> None:
    unknown = sorted(set(data) - set(specs))
    if unknown:
        raise ProfileError(f"profile {source}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(specs))})")
    for key, spec in specs.items():
        if key not in data:
            if spec.required:
                raise ProfileError(f"profile {source}: missing key {key!r}")
            continue
        _check_value(source, key, data[key], spec)


def _check_sources(source: str, sources: Mapping[str, str], numeric_keys: Sequence[str]) -> None:
    """Every number a profile holds must say where it came from."""
    for key in numeric_keys:
        if not sources.get(key, "").strip():
            raise ProfileError(f"profile {source}: key 'sources' has no citation for {key!r}")


def _check_capacity(source: str, data: Mapping[str, Any]) -> None:
    """vLLM refuses to start unless one request of ``max_model_len`` tokens fits in the KV cache."""
    # vLLM keeps one block back (the null block) before checking that a full-length request fits.
    capacity = (data["num_kv_blocks"] - 1) * data["block_size"]
    if capacity < data["max_model_len"]:
        raise ProfileError(
            f"profile {source}: key 'num_kv_blocks' gives {capacity} KV tokens "
            f"({data['num_kv_blocks']} blocks of {data['block_size']}), "
            f"fewer than max_model_len {data['max_model_len']}"
        )


# --- the profile -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    """A validated hardware/model profile: capacity, step-time cost, and the citations for both."""

    name: str
    description: str
    block_size: int  # vLLM KV block size in tokens
    num_kv_blocks: int  # KV capacity in blocks
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    cost: Cost
    sources: dict[str, str]  # field name -> citation (URL/paper/measurement and the number taken)
    derivation: dict[str, str] = field(default_factory=dict)  # field name -> how it was computed
    validation: list[Any] = field(default_factory=list)  # predicted vs published comparisons
    host_link_bytes_per_s: float | None = None  # achieved device <-> host copy bandwidth, one direction
    pd_link_bytes_per_s: float | None = None  # achieved read bandwidth between two instances' KV caches
    pd_link_latency_ms: float | None = None  # a hand-off's fixed cost: the read's set-up and its notice
    noise: StepNoise | None = None  # how a real engine's step times wander around the cost (None: they do not)

    @property
    def model(self) -> str:
        """The cost form: ``roofline`` or ``linear``."""
        return "roofline" if isinstance(self.cost, RooflineCost) else "linear"

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size

    def step_time_ms(self, batch: StepBatch) -> float:
        """Wall time of one engine step of shape ``batch``, in ms (the cost, without noise)."""
        return self.cost.step_ms(batch)

    def step_timer(self, stream: int = 0) -> Callable[[Mapping[str, int]], float]:
        """One engine's step-time function of the step's shape (``StepBatch``'s fields): the cost,
        with the profile's noise on it when it has one (``stream`` tells a replay's engines apart;
        the ``n``-th step of every engine on one stream meets the same noise)."""

        def cost(shape: Mapping[str, int]) -> float:
            return self.cost.step_ms(StepBatch(**shape))

        return cost if self.noise is None else self.noise.timer(cost, stream)

    def with_noise(self, noise: StepNoise | None) -> Profile:
        return dataclasses.replace(self, noise=noise)

    def host_load_ms_per_token(self) -> float:
        """What loading one token's KV back from host memory takes on the host link, in ms;
        ``ProfileError`` when the profile cannot say (no link, or no KV size per token)."""
        kv_bytes = getattr(self.cost, "kv_bytes_per_token", None)
        if self.host_link_bytes_per_s is None or kv_bytes is None:
            raise ProfileError(
                f"profile {self.name}: the host KV tier needs 'host_link_bytes_per_s' and a roofline "
                "profile's 'kv_bytes_per_token'"
            )
        return float(kv_bytes) / self.host_link_bytes_per_s * 1e3

    def transfer_cost(self, link_bytes_per_s: float | None = None, latency_ms: float | None = None) -> TransferCost:
        """What a prefill/decode hand-off costs: KV bytes per token over the link, and its fixed
        latency; each from the profile unless given. ``ProfileError`` when neither says."""
        kv_bytes = getattr(self.cost, "kv_bytes_per_token", None)
        bandwidth = link_bytes_per_s if link_bytes_per_s is not None else self.pd_link_bytes_per_s
        latency = latency_ms if latency_ms is not None else self.pd_link_latency_ms
        if bandwidth is None or kv_bytes is None or bandwidth <= 0:
            raise ProfileError(
                f"profile {self.name}: a hand-off's cost needs a link bandwidth ('pd_link_bytes_per_s' or the "
                "replay's --transfer-gbps, > 0) and a roofline profile's 'kv_bytes_per_token'"
            )
        return TransferCost(ms_per_token=float(kv_bytes) / bandwidth * 1e3, latency_ms=latency or 0.0)

    @classmethod
    def load(cls, name_or_path: str | Path) -> Profile:
        """A bundled profile by name (``available_profiles()``) or a profile JSON file by path."""
        path = _resolve(name_or_path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ProfileError(f"profile {path}: cannot read: {exc}") from exc
        try:
            data = json.loads(text, parse_constant=_reject_constant)
        except ValueError as exc:
            raise ProfileError(f"profile {path}: not valid JSON: {exc}") from exc
        return cls.from_json(data, source=str(path))

    @classmethod
    def from_json(cls, data: object, *, source: str = "<dict>") -> Profile:
        """Validates ``data`` (the layout ``to_json`` writes) and builds the profile; errors name
        ``source`` and the offending key."""
        if not isinstance(data, dict):
            raise ProfileError(f"profile {source}: must be a JSON object, got {type(data).__name__}")
        model = data.get("model")
        if model not in COST_KEYS:
            raise ProfileError(f"profile {source}: key 'model' must be one of {sorted(COST_KEYS)}, got {model!r}")
        cost_specs = COST_KEYS[model]
        _check_keys(source, data, {**META_KEYS, **CAPACITY_KEYS, **cost_specs, **TIER_KEYS})
        _check_sources(source, data["sources"], [*CAPACITY_KEYS, *cost_specs, *(k for k in TIER_KEYS if k in data)])
        _check_capacity(source, data)
        cost = COST_TYPES[model](**{key: data[key] for key in cost_specs})
        return cls(
            name=data["name"],
            description=data["description"],
            cost=cost,
            sources=dict(data["sources"]),
            derivation=dict(data.get("derivation", {})),
            validation=list(data.get("validation", [])),
            host_link_bytes_per_s=data.get("host_link_bytes_per_s"),
            pd_link_bytes_per_s=data.get("pd_link_bytes_per_s"),
            pd_link_latency_ms=data.get("pd_link_latency_ms"),
            **{key: data[key] for key in CAPACITY_KEYS},
        )

    def to_json(self) -> dict[str, Any]:
        """The profile as the JSON object ``from_json``/``load`` read back."""
        data: dict[str, Any] = {"name": self.name, "description": self.description, "model": self.model}
        data.update({key: getattr(self, key) for key in CAPACITY_KEYS})
        data.update({key: getattr(self.cost, key) for key in COST_KEYS[self.model]})
        for key in TIER_KEYS:
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        data["sources"] = dict(self.sources)
        if self.derivation:
            data["derivation"] = dict(self.derivation)
        if self.validation:
            data["validation"] = list(self.validation)
        return data


def available_profiles() -> list[str]:
    """Names of the bundled profiles, for ``Profile.load``."""
    return sorted(path.stem for path in BUNDLED_DIR.glob("*.json"))


def _resolve(name_or_path: str | Path) -> Path:
    if isinstance(name_or_path, str) and name_or_path in available_profiles():
        return BUNDLED_DIR / f"{name_or_path}.json"
    path = Path(name_or_path)
    if not path.is_file():
        raise ProfileError(
            f"profile {name_or_path}: neither a bundled profile ({', '.join(available_profiles())}) nor a file"
        )
    return path


def _reject_constant(token: str) -> float:
    raise ValueError(f"{token} is not a finite number")


# --- fitting a linear profile to a step log --------------------------------------------------


@dataclass(frozen=True)
class _StepRow:
    line: int
    batch: StepBatch
    step_ms: float


_LOG_INT_KEYS = ("num_prefill_tokens", "num_decode_requests", "num_context_tokens")


def read_step_log(path: str | Path) -> list[_StepRow]:
    """The non-blank lines of a JSONL step log (``step_log_path``), in order. Each must be an
    object with the three batch counts (non-negative ints) and ``step_ms`` (a non-negative
    number); other keys are ignored. Raises ``ProfileError`` naming the file and 1-based line."""
    rows: list[_StepRow] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ProfileError(f"step log {path}: cannot read: {exc}") from exc
    for number, line in enumerate(lines, start=1):
        if line.strip():
            rows.append(_parse_step_line(path, number, line))
    return rows


def _parse_step_line(path: str | Path, number: int, line: str) -> _StepRow:
    where = f"step log {path}:{number}"
    try:
        record = json.loads(line, parse_constant=_reject_constant)
    except ValueError as exc:
        raise ProfileError(f"{where}: not valid JSON: {exc}") from exc
    if not isinstance(record, dict):
        raise ProfileError(f"{where}: must be a JSON object, got {type(record).__name__}")
    for key in (*_LOG_INT_KEYS, "step_ms"):
        if key not in record:
            raise ProfileError(f"{where}: missing key {key!r}")
    for key in _LOG_INT_KEYS:
        if not _is_int(record[key]) or record[key] < 0:
            raise ProfileError(f"{where}: key {key!r} must be a non-negative int, got {record[key]!r}")
    step_ms = record["step_ms"]
    if not _is_number(step_ms) or step_ms < 0:
        raise ProfileError(f"{where}: key 'step_ms' must be a non-negative number, got {step_ms!r}")
    batch = StepBatch(*(record[key] for key in _LOG_INT_KEYS))
    return _StepRow(number, batch, float(step_ms))


_LINEAR_COLUMNS = ("base_ms", "per_prefill_token_ms", "per_decode_request_ms", "per_context_token_ms")


def fit_profile(
    step_log_path: str | Path,
    base: Profile,
    name: str,
    *,
    warmup_steps: int = DEFAULT_WARMUP_STEPS,
    outlier_mads: float = DEFAULT_OUTLIER_MADS,
) -> Profile:
    """A ``linear`` profile fitted to a step log, keeping ``base``'s capacity fields.

    Outliers: an engine's first steps carry warm-up (lazy initialisation, first-use kernel
    compilation), so the first ``warmup_steps`` logged steps are dropped; steps that scheduled no
    tokens are dropped too. The rest are fitted by non-negative least squares on relative error
    (each step weighted by 1 / step_ms, since timing jitter grows with the step), then, repeatedly
    until the kept set stops changing, every step whose relative residual lies more than
    ``outlier_mads`` robust standard deviations (1.4826 * median absolute deviation of the kept
    residuals) from their median is set aside and the kept ones refitted. ``sources`` records the
    log, the point counts and the residual."""
    import numpy as np

    rows = read_step_log(step_log_path)
    warm = rows[warmup_steps:]
    usable = [row for row in warm if not row.batch.is_empty]
    if len(usable) < 2 * len(_LINEAR_COLUMNS):
        raise ProfileError(
            f"step log {step_log_path}: {len(usable)} usable steps after dropping {min(warmup_steps, len(rows))} "
            f"warm-up and {len(warm) - len(usable)} empty ones; need at least {2 * len(_LINEAR_COLUMNS)}"
        )
    design = np.array(
        [[1.0, r.batch.num_prefill_tokens, r.batch.num_decode_requests, r.batch.num_context_tokens] for r in usable]
    )
    target = np.array([r.step_ms for r in usable])
    _check_identifiable(step_log_path, design)
    coefficients, kept = _robust_nnls(design, target, outlier_mads)
    residuals = design[kept] @ coefficients - target[kept]
    rms_ms = float(np.sqrt(np.mean(residuals**2)))
    fit_note = (
        f"NNLS over {int(kept.sum())} steps of {len(rows)} logged "
        f"({min(warmup_steps, len(rows))} warm-up, {len(warm) - len(usable)} empty, "
        f"{len(usable) - int(kept.sum())} outliers beyond {outlier_mads:g} MADs dropped); "
        f"RMS residual {rms_ms:.4g} ms = {rms_ms / float(np.mean(target[kept])):.2%} of the mean step, "
        f"max |residual| {float(np.max(np.abs(residuals))):.4g} ms"
    )
    sources = {key: base.sources[key] for key in CAPACITY_KEYS}
    sources.update({key: f"fitted to {step_log_path}: {fit_note}" for key in _LINEAR_COLUMNS})
    sources.update({"step_log": str(step_log_path), "fit": fit_note, "capacity": f"from profile {base.name}"})
    data: dict[str, Any] = {
        "name": name,
        "description": f"Linear step-time fit of {step_log_path} with the capacity of {base.name}",
        "model": "linear",
        **{key: getattr(base, key) for key in CAPACITY_KEYS},
        **{key: float(value) for key, value in zip(_LINEAR_COLUMNS, coefficients)},
        "sources": sources,
    }
    return Profile.from_json(data, source=f"fit of {step_log_path}")


def _check_identifiable(path: str | Path, design: npt.NDArray[np.float64]) -> None:
    """Each coefficient needs steps that exercise its input, and the inputs must not move in
    lockstep, or the fit would silently zero (or trade off) coefficients the log says nothing about."""
    import numpy as np

    for column, key in enumerate(_LINEAR_COLUMNS[1:], start=1):
        if not np.any(design[:, column]):
            raise ProfileError(f"step log {path}: no usable step has {_LOG_INT_KEYS[column - 1]} > 0; cannot fit {key}")
    if np.linalg.matrix_rank(_scaled(design)[0]) < design.shape[1]:
        raise ProfileError(
            f"step log {path}: the batch inputs are collinear over the usable steps; cannot fit 4 coefficients"
        )


def _robust_nnls(
    design: npt.NDArray[np.float64], target: npt.NDArray[np.float64], outlier_mads: float
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """Relative-error NNLS with iterated median-absolute-deviation outlier rejection; returns the
    coefficients and the mask of steps kept."""
    import numpy as np

    weights = 1.0 / np.maximum(target, 1e-3 * float(np.median(target)) + 1e-12)
    weighted_design, weighted_target = design * weights[:, None], target * weights
    kept = np.ones(len(target), dtype=bool)
    coefficients = _nnls(weighted_design, weighted_target)
    for _ in range(50):
        residuals = (design @ coefficients - target) * weights  # relative: 0.01 = 1% off
        center = float(np.median(residuals[kept]))
        scale = 1.4826 * float(np.median(np.abs(residuals[kept] - center)))
        new_kept = np.abs(residuals - center) <= max(outlier_mads * scale, 1e-9)  # noise-free: MAD 0
        if np.array_equal(new_kept, kept) or new_kept.sum() < design.shape[1]:
            break
        kept = new_kept
        coefficients = _nnls(weighted_design[kept], weighted_target[kept])
    return coefficients, kept


def _scaled(design: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Columns scaled to unit norm (the inputs differ by orders of magnitude), and the scales."""
    import numpy as np

    norms = np.linalg.norm(design, axis=0)
    norms[norms == 0] = 1.0
    return design / norms, norms


def _nnls(design: npt.NDArray[np.float64], target: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """min ||design @ x - target|| subject to x >= 0, by Lawson and Hanson's active-set method
    (Solving Least Squares Problems, 1974, ch. 23) on unit-norm columns."""
    import numpy as np

    a, norms = _scaled(design)
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 1e-10 * max(1.0, float(np.linalg.norm(target)))
    gradient = a.T @ (target - a @ x)
    for _ in range(3 * n + 10):
        candidates = ~passive & (gradient > tol)
        if not candidates.any():
            break
        passive[int(np.argmax(np.where(candidates, gradient, -np.inf)))] = True
        while True:
            trial = np.zeros(n)
            trial[passive] = np.linalg.lstsq(a[:, passive], target, rcond=None)[0]
            if np.all(trial[passive] > 0):
                x = trial
                break
            blocking = passive & (trial <= 0)
            step = float(np.min(x[blocking] / (x[blocking] - trial[blocking])))
            x = x + step * (trial - x)
            passive &= x > tol
            x[~passive] = 0.0
        gradient = a.T @ (target - a @ x)
    result: npt.NDArray[np.float64] = x / norms
    return result


def step_noise_of_log(step_log_path: str | Path, profile: Profile, *, warmup_steps: int | None = None) -> StepNoise:
    """``fit_step_noise`` on a step log (``step_log_path``) against ``profile`` (best the one
    ``fit_profile`` fitted to the same log), its warm-up and empty steps dropped as the fit drops
    them."""
    rows = read_step_log(step_log_path)[DEFAULT_WARMUP_STEPS if warmup_steps is None else warmup_steps :]
    usable = [row for row in rows if not row.batch.is_empty]
    return fit_step_noise(
        [row.step_ms for row in usable], [profile.step_time_ms(row.batch) for row in usable], str(step_log_path)
    )


def write_fitted_profile(step_log_path: Path, base: str, name: str, out: Path, noise_out: Path | None = None) -> str:
    """``meridian fit-profile``: fits ``step_log_path`` on top of the profile ``base`` (name or
    JSON file), writes the new profile to ``out`` and, given ``noise_out``, the log's step-time
    noise around it (``meridian.replay.noise``); returns what the fit reports."""
    profile = fit_profile(step_log_path, Profile.load(base), name)
    out.write_text(json.dumps(profile.to_json(), indent=2) + "\n", encoding="utf-8")
    report = f"wrote {out}: {profile.sources['fit']}"
    if noise_out is not None:
        noise = step_noise_of_log(step_log_path, profile)
        noise_out.write_text(json.dumps(noise.to_json(), indent=2) + "\n", encoding="utf-8")
        report += (
            f"\nwrote {noise_out}: step-time noise sigma {noise.sigma:.3f} (log), rho {noise.rho:.2f}, "
            f"spikes {noise.spike_probability:.1%} of steps at x{math.exp(noise.spike_log_mean):.2f}"
        )
    return report
