"""Step-time noise (``meridian.replay.noise``): the model's range checks, its seeded timer (mean
preserving, deterministic per seed and stream, common to every policy), the fit recovering the
parameters of noise it generated, and a replay on a noisy profile through ``meridian replay``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meridian.errors import ProfileError
from meridian.replay.noise import NOISE_FORMAT, StepNoise, fit_step_noise
from meridian.replay.profiles import StepBatch
from replay_profiles import linear_profile, linear_profile_data

SHAPE = {"num_prefill_tokens": 0, "num_decode_requests": 4, "num_context_tokens": 400}
EMPTY = {"num_prefill_tokens": 0, "num_decode_requests": 0, "num_context_tokens": 0}


def constant(ms: float):  # type: ignore[no-untyped-def]
    return lambda shape: 0.0 if shape == EMPTY else ms


@pytest.mark.parametrize(
    ("field", "value"),
    [("sigma", -0.1), ("rho", 1.0), ("rho", -0.2), ("spike_probability", 1.0), ("spike_log_sd", -1.0),
     ("slow_sigma", -0.5), ("slow_rho", 1.0),
     ("sigma", math.nan), ("spike_log_mean", math.inf)],
)
def test_a_parameter_out_of_range_is_refused_by_name(field: str, value: float) -> None:
    with pytest.raises(ProfileError, match=f"{field} = "):
        StepNoise(**{"sigma": 0.1, "rho": 0.5, field: value})


def test_a_file_of_another_format_or_with_unknown_keys_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "noise.json"
    path.write_text(json.dumps({"sigma": 0.1, "rho": 0.2}))
    with pytest.raises(ProfileError, match="not a step-noise model"):
        StepNoise.load(path)
    path.write_text(json.dumps({"format": NOISE_FORMAT, "sigma": 0.1, "rho": 0.2, "sigmaa": 1}))
    with pytest.raises(ProfileError, match="unknown keys \\['sigmaa'\\]"):
        StepNoise.load(path)
    path.write_text(json.dumps({"format": NOISE_FORMAT, "sigma": 0.1, "rho": 2}))
    with pytest.raises(ProfileError, match=f"{path}: step noise: rho = 2"):
        StepNoise.load(path)
    for bad in ({"sigma": "x"}, {"rho": True}, {"slow_sigma": None}, {"source": 5}):
        path.write_text(json.dumps({"format": NOISE_FORMAT, "sigma": 0.1, "rho": 0.2, **bad}))
        with pytest.raises(ProfileError, match=f"{next(iter(bad))} = "):
            StepNoise.load(path)


def test_the_timer_keeps_the_mean_step_and_is_the_same_for_every_policy_of_a_stream() -> None:
    noise = StepNoise(sigma=0.3, rho=0.6, spike_probability=0.05, spike_log_mean=1.0, spike_log_sd=0.2,
                      slow_sigma=0.2, slow_rho=0.99, seed=7)
    timer = noise.timer(constant(10.0))
    draws = [timer(SHAPE) for _ in range(40_000)]
    assert np.mean(draws) == pytest.approx(10.0, rel=0.03)
    again = noise.timer(constant(10.0))
    assert [again(SHAPE) for _ in range(100)] == draws[:100]
    other_stream = noise.timer(constant(10.0), stream=1)
    assert [other_stream(SHAPE) for _ in range(100)] != draws[:100]
    other_seed = noise.with_seed(8).timer(constant(10.0))
    assert [other_seed(SHAPE) for _ in range(100)] != draws[:100]
    assert noise.timer(constant(10.0))(EMPTY) == 0.0


@settings(max_examples=60, deadline=None)
@given(
    sigma=st.floats(0, 3), rho=st.floats(0, 0.99), p=st.floats(0, 0.99), mean=st.floats(-5, 5),
    sd=st.floats(0, 3), slow=st.floats(0, 2), slow_rho=st.floats(0, 0.9999), seed=st.integers(0, 2**32 - 1),
    ms=st.floats(0, 1e4),
)
def test_a_noisy_step_is_finite_and_not_negative(
    sigma: float, rho: float, p: float, mean: float, sd: float, slow: float, slow_rho: float, seed: int, ms: float
) -> None:
    timer = StepNoise(sigma, rho, p, mean, sd, slow, slow_rho, seed=seed).timer(constant(ms))
    for _ in range(50):
        value = timer(SHAPE)
        assert math.isfinite(value) and value >= 0.0


def test_the_fit_recovers_the_noise_it_is_given() -> None:
    truth = StepNoise(sigma=0.1, rho=0.5, spike_probability=0.02, spike_log_mean=1.2, spike_log_sd=0.1,
                      slow_sigma=0.1, slow_rho=0.995, seed=3)
    timer = truth.timer(constant(20.0))
    real = [timer(SHAPE) for _ in range(40_000)]
    fitted = fit_step_noise(real, [20.0] * len(real), "synthetic")
    assert fitted.sigma == pytest.approx(truth.sigma, rel=0.1)
    assert fitted.rho == pytest.approx(truth.rho, abs=0.05)
    assert fitted.spike_probability == pytest.approx(truth.spike_probability, rel=0.2)
    assert fitted.spike_log_mean == pytest.approx(truth.spike_log_mean, rel=0.1)
    assert fitted.slow_sigma == pytest.approx(truth.slow_sigma, rel=0.25)
    assert fitted.slow_rho == pytest.approx(truth.slow_rho, abs=0.003)
    # Noise without a slow part is not given one.
    plain = StepNoise(sigma=0.1, rho=0.5, seed=4).timer(constant(20.0))
    assert fit_step_noise([plain(SHAPE) for _ in range(20_000)], [20.0] * 20_000, "fast only").slow_sigma < 0.02
    with pytest.raises(ProfileError, match="needs 20 or more steps"):
        fit_step_noise(real[:5], [20.0] * 5, "short")


def test_a_profile_with_noise_times_its_steps_with_it_and_without_keeps_its_cost() -> None:
    profile = linear_profile()
    plain = profile.step_timer()
    assert plain(SHAPE) == 10.0
    noisy = profile.with_noise(StepNoise(sigma=0.5, rho=0.0)).step_timer()
    assert len({noisy(SHAPE) for _ in range(10)}) == 10
    # The cost itself (what Meridian's step-time model is seeded with) has no noise.
    assert profile.with_noise(StepNoise(sigma=0.5, rho=0.0)).step_time_ms(StepBatch(0, 4, 400)) == 10.0


@pytest.mark.vllm
def test_replay_with_step_noise_is_seeded_and_moves_the_timings(tmp_path: Path) -> None:
    from meridian.cli import main
    from meridian.replay.traces import TraceRequest, dump_meridian_jsonl

    trace = tmp_path / "t.jsonl"
    dump_meridian_jsonl(
        [TraceRequest(req_id=f"r{i}", arrival_ms=30.0 * i, num_prompt_tokens=40, num_output_tokens=30,
                      num_think_tokens=20, num_answer_tokens=10, slo_class="standard") for i in range(16)],
        trace,
    )
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(linear_profile_data(max_model_len=512, per_decode_request_ms=0.5)))
    noise = tmp_path / "noise.json"
    noise.write_text(json.dumps(StepNoise(sigma=0.4, rho=0.5, spike_probability=0.05, spike_log_mean=1.0).to_json()))

    def replay(out: str, *extra: str) -> dict:  # type: ignore[type-arg]
        code = main(["replay", "--trace", str(trace), "--profile", str(profile), "--policies", "vllm-fcfs,meridian",
                     "--json", str(tmp_path / out), "--no-progress", "--cache-dir", str(tmp_path / "cache"),
                     "--jobs", "1", *extra])
        assert code == 0
        return json.loads((tmp_path / out).read_text())

    quiet = replay("quiet.json")
    noisy = replay("noisy.json", "--step-noise", str(noise))
    again = replay("again.json", "--step-noise", str(noise))
    reseeded = replay("reseeded.json", "--step-noise", str(noise), "--seed", "1")
    assert quiet["workload"]["step_noise"] is None
    assert noisy["workload"]["step_noise"]["sigma"] == 0.4

    def ttfts(payload: dict) -> list:  # type: ignore[type-arg]
        return [summary["ttft_ms"] for summary in payload["policies"].values()]

    assert ttfts(noisy) == ttfts(again)
    assert ttfts(noisy) != ttfts(quiet)
    assert ttfts(reseeded) != ttfts(noisy)
