"""Step-time noise for the replay: what a real engine's step times do that a profile's step-time
model does not. A profile prices a step by its batch shape alone; a real engine's steps wander
around that price (an unpinned API server or load generator sharing the cores, a prefill spike,
co-located work), in runs rather than independently, with rare steps several times as long.

``StepNoise`` is that wandering as a seeded model of the log ratio of a step's real time to the
profile's: a stationary Gaussian body of two AR(1) parts, a fast one from step to step
(``sigma``, ``rho``) and a slow one that drifts over hundreds of steps (``slow_sigma``,
``slow_rho``: the machine's slower and faster stretches), plus independent spikes
(``spike_probability``, log factor ``spike_log_mean`` ± ``spike_log_sd``), scaled so that a step's mean time is
the profile's: the replay's load stays the load it was calibrated at, only its timing wanders.
``fit_step_noise`` reads it off a real engine's step log (``profiles.step_noise_of_log``) (the residuals of
the linear fit ``fit_profile`` makes of the same log); ``StepNoise.timer`` gives one engine's
step-time function, deterministic in ``(seed, stream)`` and the step's index, so every policy of a
replay meets the same noise at the same step (common random numbers: the comparison between two
policies is not blurred by their drawing different noise). Invariant: a ``StepNoise`` exists only
with finite parameters in range (``sigma`` ≥ 0, 0 ≤ ``rho`` < 1, 0 ≤ ``spike_probability`` < 1,
``spike_log_sd`` ≥ 0), and a noisy step time is finite, ≥ 0, 0 exactly when the profile's is,
and on average the profile's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from meridian.errors import ProfileError

__all__ = ["NOISE_FORMAT", "StepNoise", "fit_step_noise"]

#: The format tag of a noise model's JSON file.
NOISE_FORMAT = "meridian-step-noise/1"
#: A residual further than this many robust standard deviations above the body's median is a spike.
SPIKE_MADS = 4.0
#: Steps over which the body's slow part is averaged out of the fast one.
SLOW_WINDOW_STEPS = 200
#: Robust standard deviations per median absolute deviation of a normal distribution.
_MAD_TO_SD = 1.4826


@dataclass(frozen=True)
class StepNoise:
    """A seeded model of ``log(real step time / profile step time)`` (the module doc)."""

    sigma: float
    rho: float
    spike_probability: float = 0.0
    spike_log_mean: float = 0.0
    spike_log_sd: float = 0.0
    slow_sigma: float = 0.0
    slow_rho: float = 0.0
    seed: int = 0
    source: str = ""

    def __post_init__(self) -> None:
        checks: tuple[tuple[str, Callable[[float], bool]], ...] = (
            ("sigma", lambda v: v >= 0),
            ("rho", lambda v: 0 <= v < 1),
            ("spike_probability", lambda v: 0 <= v < 1),
            ("spike_log_mean", lambda v: True),
            ("spike_log_sd", lambda v: v >= 0),
            ("slow_sigma", lambda v: v >= 0),
            ("slow_rho", lambda v: 0 <= v < 1),
        )
        for name, in_range in checks:
            value = getattr(self, name)
            # The type first: a string or a bool from a JSON file is named, not compared.
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise ProfileError(f"step noise: {name} = {value!r} is not a finite number")
            if not in_range(value):
                raise ProfileError(f"step noise: {name} = {value!r} is out of range")
        if not isinstance(self.source, str):
            raise ProfileError(f"step noise: source = {self.source!r} is not a string")

    def with_seed(self, seed: int) -> StepNoise:
        return StepNoise(**{**asdict(self), "seed": seed})

    def timer(
        self, step_ms: Callable[[Mapping[str, int]], float], stream: int = 0
    ) -> Callable[[Mapping[str, int]], float]:
        """``step_ms`` with this noise on it: one engine's step-time function (``stream`` tells
        engines of one replay apart), the ``n``-th call drawing the ``n``-th step's factor."""
        import numpy as np

        rng = np.random.Generator(np.random.PCG64([self.seed, stream]))
        innovation_sd = self.sigma * math.sqrt(1.0 - self.rho * self.rho)
        slow_innovation_sd = self.slow_sigma * math.sqrt(1.0 - self.slow_rho * self.slow_rho)
        # Both parts start in their stationary laws.
        state = [float(rng.normal(0.0, self.sigma)), float(rng.normal(0.0, self.slow_sigma))]
        # E[exp(body)] = exp(variance / 2); a spike's mean factor is lognormal's mean.
        spike_mean = math.exp(self.spike_log_mean + self.spike_log_sd**2 / 2)
        log_scale = -(self.sigma**2 + self.slow_sigma**2) / 2 - math.log1p(self.spike_probability * (spike_mean - 1.0))

        def noisy(shape: Mapping[str, int]) -> float:
            body, slow, spike, spike_size = (
                rng.normal(0.0, innovation_sd),
                rng.normal(0.0, slow_innovation_sd),
                rng.random(),
                rng.normal(),
            )
            state[0] = self.rho * state[0] + body
            state[1] = self.slow_rho * state[1] + slow
            log_factor = log_scale + state[0] + state[1]
            if spike < self.spike_probability:
                log_factor += self.spike_log_mean + self.spike_log_sd * spike_size
            return step_ms(shape) * math.exp(log_factor)

        return noisy

    def to_json(self) -> dict[str, Any]:
        return {"format": NOISE_FORMAT, **{k: v for k, v in asdict(self).items() if k != "seed"}}

    @staticmethod
    def from_json(data: Mapping[str, Any], *, seed: int = 0, where: str = "step noise") -> StepNoise:
        if not isinstance(data, Mapping) or data.get("format") != NOISE_FORMAT:
            raise ProfileError(f"{where}: not a step-noise model (its 'format' must be {NOISE_FORMAT!r})")
        fields = {
            "sigma",
            "rho",
            "spike_probability",
            "spike_log_mean",
            "spike_log_sd",
            "slow_sigma",
            "slow_rho",
            "source",
        }
        unknown = sorted(set(data) - fields - {"format"})
        if unknown:
            raise ProfileError(f"{where}: unknown keys {unknown}")
        missing = sorted({"sigma", "rho"} - set(data))
        if missing:
            raise ProfileError(f"{where}: missing keys {missing}")
        try:
            return StepNoise(**{k: v for k, v in data.items() if k != "format"}, seed=seed)
        except ProfileError as exc:
            raise ProfileError(f"{where}: {exc}") from exc

    @staticmethod
    def load(path: str | Path, *, seed: int = 0) -> StepNoise:
        """A noise model from its JSON file (``meridian fit-profile --noise-out``)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ProfileError(f"step noise {path}: cannot read: {exc}") from exc
        return StepNoise.from_json(data, seed=seed, where=f"step noise {path}")


def fit_step_noise(step_ms: list[float], predicted_ms: list[float], source: str) -> StepNoise:
    """The noise model of a step log: ``step_ms`` the real times of consecutive steps (the log's
    order), ``predicted_ms`` what the profile fitted to the same log predicts for each. Spikes are
    residuals past ``SPIKE_MADS`` robust standard deviations above the median, replaced by the
    median in the body (so a spike neither breaks a run nor counts as one). The body's slow part
    is its moving mean over ``SLOW_WINDOW_STEPS`` steps (its spread, less what the fast part's
    own averaging leaves in it, and its persistence from its autocorrelation one window apart);
    the fast part is what is left, its AR(1) coefficient the lag-1 autocorrelation."""
    import numpy as np

    if len(step_ms) != len(predicted_ms) or len(step_ms) < 20:
        raise ProfileError(f"step noise from {source}: needs 20 or more steps with predictions, got {len(step_ms)}")
    real, model = np.asarray(step_ms, dtype=float), np.asarray(predicted_ms, dtype=float)
    usable = (real > 0) & (model > 0)
    if int(usable.sum()) < 20:
        raise ProfileError(f"step noise from {source}: {int(usable.sum())} steps with a positive time; needs 20")
    residual = np.log(real[usable] / model[usable])
    median = float(np.median(residual))
    robust_sd = _MAD_TO_SD * float(np.median(np.abs(residual - median)))
    spikes = residual > median + SPIKE_MADS * robust_sd
    body = np.where(spikes, median, residual) - median
    slow_sigma, slow_rho, slow = _slow_part(body)
    fast = body - slow
    sigma = float(np.std(fast[~spikes]))
    rho = float(np.corrcoef(fast[:-1], fast[1:])[0, 1]) if sigma > 0 else 0.0
    spike_logs = residual[spikes] - median
    return StepNoise(
        sigma=sigma,
        rho=min(max(rho, 0.0), 0.99) if math.isfinite(rho) else 0.0,
        spike_probability=float(spikes.mean()),
        spike_log_mean=float(spike_logs.mean()) if spikes.any() else 0.0,
        spike_log_sd=float(spike_logs.std()) if spikes.sum() > 1 else 0.0,
        slow_sigma=slow_sigma,
        slow_rho=slow_rho,
        source=f"{source}: {int(usable.sum())} steps, {int(spikes.sum())} spikes past {SPIKE_MADS:g} MADs",
    )


def _slow_part(body: Any) -> tuple[float, float, Any]:
    """The slow part of a residual series: its spread and per-step persistence, and the part itself
    (zeros when the series is too short to see one or it does not persist)."""
    import numpy as np

    window = SLOW_WINDOW_STEPS
    if len(body) < 4 * window:
        return 0.0, 0.0, np.zeros_like(body)
    slow = np.convolve(body, np.ones(window) / window, mode="same")
    lag_corr = float(np.corrcoef(slow[:-window], slow[window:])[0, 1])
    # What a window's mean keeps of the fast part: its variance / window, times (1 + r) / (1 - r)
    # for its step-to-step correlation r (the lag-1 correlation of the body, near the fast part's).
    r = min(max(float(np.corrcoef(body[:-1], body[1:])[0, 1]), 0.0), 0.99)
    variance = float(np.var(slow)) - float(np.var(body)) * (1 + r) / (1 - r) / window
    if not (math.isfinite(lag_corr) and lag_corr > 0 and variance > 0):
        return 0.0, 0.0, np.zeros_like(body)
    rho = min(lag_corr ** (1.0 / window), 0.9999)
    # A window's mean of an AR(1) keeps this share of its variance (it averages part of it away).
    kept = ((1 + rho) / (1 - rho) - 2 * rho * (1 - rho**window) / (window * (1 - rho) ** 2)) / window
    return math.sqrt(variance / min(kept, 1.0)), rho, slow
