"""Replay hardware/model profiles (``meridian.replay.profiles``): the bundled profiles load, their
step time behaves like a GPU step (monotone, sane magnitudes), bad profile files are refused with
the file and key named, and ``fit_profile`` recovers a linear cost from a noisy step log."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meridian.errors import ConfigError, InvalidArgumentError, ProfileError
from meridian.replay.profiles import (
    LinearCost,
    Profile,
    RooflineCost,
    StepBatch,
    available_profiles,
    fit_profile,
)

BUNDLED = ("h200-qwen3-8b", "h200-qwen3-32b")


def bundled_json(name: str) -> dict[str, Any]:
    return Profile.load(name).to_json()


def write(tmp_path: Path, data: object, name: str = "profile.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data, encoding="utf-8")
    return path


def linear_profile() -> Profile:
    data = bundled_json("h200-qwen3-8b")
    for key in ("overhead_ms", "hbm_bytes_per_s", "mem_efficiency", "peak_flops", "compute_efficiency",
                "weight_bytes", "kv_bytes_per_token", "active_params", "lm_head_params",
                "attn_flops_per_context_token"):
        del data[key]
    coefficients = {"base_ms": 4.0, "per_prefill_token_ms": 0.03, "per_decode_request_ms": 0.02,
                    "per_context_token_ms": 4e-5}
    data.update(model="linear", **coefficients)
    data["sources"].update({key: "test value" for key in coefficients})
    return Profile.from_json(data)


# --- bundled profiles ------------------------------------------------------------------------


def test_bundled_profiles_are_listed_and_load() -> None:
    assert set(BUNDLED) <= set(available_profiles())
    for name in BUNDLED:
        profile = Profile.load(name)
        assert profile.name == name
        assert profile.model == "roofline" and isinstance(profile.cost, RooflineCost)
        assert profile.block_size == 16
        assert profile.kv_capacity_tokens >= profile.max_model_len
        assert profile.max_num_batched_tokens <= profile.kv_capacity_tokens
        assert profile.validation, "bundled profiles carry their comparison against published numbers"
        assert Profile.from_json(profile.to_json()) == profile


def test_bundled_profile_loads_by_path_too() -> None:
    by_name = Profile.load("h200-qwen3-8b")
    path = Path(__file__).resolve().parents[2] / "python/meridian/replay/profiles/h200-qwen3-8b.json"
    assert Profile.load(str(path)) == by_name == Profile.load(path)


def test_kv_arithmetic_matches_the_model_shapes() -> None:
    # 2 (K,V) x layers x KV heads x head_dim x 2 bytes (BF16)
    small, large = Profile.load("h200-qwen3-8b").cost, Profile.load("h200-qwen3-32b").cost
    assert isinstance(small, RooflineCost) and isinstance(large, RooflineCost)
    assert small.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2
    assert large.kv_bytes_per_token == 2 * 64 * 8 * 128 * 2
    assert small.attn_flops_per_context_token == 4 * 36 * 32 * 128
    assert large.attn_flops_per_context_token == 4 * 64 * 64 * 128


@pytest.mark.parametrize(("name", "low", "high"), [("h200-qwen3-8b", 3.0, 15.0), ("h200-qwen3-32b", 10.0, 40.0)])
def test_batch_one_decode_is_in_a_sane_band(name: str, low: float, high: float) -> None:
    step = Profile.load(name).step_time_ms(StepBatch(0, 1, 2048))
    assert low <= step <= high


@pytest.mark.parametrize(("name", "low", "high"), [("h200-qwen3-8b", 100.0, 500.0), ("h200-qwen3-32b", 500.0, 2500.0)])
def test_an_8k_prefill_is_compute_bound_and_of_the_right_order(name: str, low: float, high: float) -> None:
    profile = Profile.load(name)
    assert isinstance(profile.cost, RooflineCost)
    batch = StepBatch(8192, 0, 8192)
    terms = profile.cost.terms(batch)
    assert terms.dense_compute_ms > 10 * terms.dense_memory_ms
    assert terms.attention_compute_ms > 10 * terms.attention_memory_ms
    assert low <= profile.step_time_ms(batch) <= high


def test_large_batch_decode_is_kv_bound() -> None:
    profile = Profile.load("h200-qwen3-8b")
    assert isinstance(profile.cost, RooflineCost)
    terms = profile.cost.terms(StepBatch(0, 256, 256 * 4096))
    assert terms.attention_memory_ms > terms.dense_memory_ms


def test_an_empty_step_takes_no_time() -> None:
    for profile in (*(Profile.load(name) for name in BUNDLED), linear_profile()):
        assert profile.step_time_ms(StepBatch(0, 0, 0)) == 0.0
        assert profile.step_time_ms(StepBatch(0, 0, 1000)) == 0.0


@pytest.mark.parametrize("args", [(-1, 0, 0), (0, -1, 0), (0, 0, -5), (1.5, 0, 0), (True, 0, 0)])
def test_step_batch_rejects_bad_counts(args: tuple[Any, Any, Any]) -> None:
    with pytest.raises(InvalidArgumentError, match="StepBatch"):
        StepBatch(*args)


PROFILES = [Profile.load(name) for name in BUNDLED] + [linear_profile()]


@settings(max_examples=300, deadline=None)
@given(
    profile_index=st.integers(0, len(PROFILES) - 1),
    p=st.integers(0, 16384),
    d=st.integers(0, 1024),
    c=st.integers(0, 4_000_000),
    dp=st.integers(0, 8192),
    dd=st.integers(0, 512),
    dc=st.integers(0, 1_000_000),
)
def test_step_time_is_monotone_in_each_input(
    profile_index: int, p: int, d: int, c: int, dp: int, dd: int, dc: int
) -> None:
    profile = PROFILES[profile_index]
    base = profile.step_time_ms(StepBatch(p, d, c))
    assert base >= 0.0
    assert profile.step_time_ms(StepBatch(p + dp, d, c)) >= base
    assert profile.step_time_ms(StepBatch(p, d + dd, c)) >= base
    assert profile.step_time_ms(StepBatch(p, d, c + dc)) >= base


# --- bad profile files -----------------------------------------------------------------------


def mutate(data: dict[str, Any], change: str) -> str:
    """Applies one named defect to a profile dict; returns the key the error must name."""
    if change == "missing":
        del data["num_kv_blocks"]
        return "num_kv_blocks"
    if change == "negative":
        data["overhead_ms"] = -1.0
        return "overhead_ms"
    if change == "unknown":
        data["turbo_mode"] = True
        return "turbo_mode"
    if change == "float_for_int":
        data["max_num_seqs"] = 256.5
        return "max_num_seqs"
    if change == "bool_for_int":
        data["block_size"] = True
        return "block_size"
    if change == "zero":
        data["hbm_bytes_per_s"] = 0
        return "hbm_bytes_per_s"
    if change == "efficiency_above_one":
        data["mem_efficiency"] = 1.5
        return "mem_efficiency"
    if change == "string_for_number":
        data["peak_flops"] = "989 TFLOPS"
        return "peak_flops"
    if change == "uncited":
        del data["sources"]["compute_efficiency"]
        return "compute_efficiency"
    if change == "too_little_kv":
        data["num_kv_blocks"] = 10
        return "num_kv_blocks"
    if change == "bad_model":
        data["model"] = "quadratic"
        return "model"
    raise AssertionError(change)


CHANGES = ["missing", "negative", "unknown", "float_for_int", "bool_for_int", "zero", "efficiency_above_one",
           "string_for_number", "uncited", "too_little_kv", "bad_model"]


@pytest.mark.parametrize("change", CHANGES)
def test_bad_profile_file_names_the_file_and_key(tmp_path: Path, change: str) -> None:
    data = bundled_json("h200-qwen3-32b")
    key = mutate(data, change)
    path = write(tmp_path, data)
    with pytest.raises(ProfileError) as info:
        Profile.load(str(path))
    message = str(info.value)
    assert str(path) in message and repr(key) in message, message


def test_linear_profile_rejects_roofline_keys(tmp_path: Path) -> None:
    data = linear_profile().to_json()
    data["overhead_ms"] = 1.0
    data["sources"]["overhead_ms"] = "x"
    path = write(tmp_path, data)
    with pytest.raises(ProfileError, match="'overhead_ms'"):
        Profile.load(path)


@pytest.mark.parametrize(
    ("text", "match"),
    [("{not json", "not valid JSON"), ("[1, 2]", "must be a JSON object"), ('{"overhead_ms": NaN}', "not valid JSON")],
)
def test_unparseable_profile_names_the_file(tmp_path: Path, text: str, match: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ProfileError, match=match) as info:
        Profile.load(path)
    assert str(path) in str(info.value)


def test_unknown_profile_name() -> None:
    with pytest.raises(ProfileError, match="h200-llama-999b.*neither a bundled profile"):
        Profile.load("h200-llama-999b")


def test_profile_errors_are_config_errors() -> None:
    assert issubclass(ProfileError, ConfigError) and issubclass(ProfileError, ValueError)


# --- fitting a linear profile ----------------------------------------------------------------

TRUE = LinearCost(base_ms=3.0, per_prefill_token_ms=0.025, per_decode_request_ms=0.04, per_context_token_ms=3e-5)


def synthetic_log(path: Path, *, steps: int = 400, warmup_outliers: int = 3, late_outliers: int = 3,
                  noise: float = 0.01, seed: int = 7) -> None:
    """Step log lines from ``TRUE`` with +-``noise`` multiplicative jitter, ``warmup_outliers`` slow
    steps at the start (compilation) and ``late_outliers`` slow ones scattered later (hiccups)."""
    rng = random.Random(seed)
    lines = []
    late = set(rng.sample(range(50, steps), late_outliers))
    for i in range(steps):
        decode = rng.randint(0, 512)
        prefill = rng.choice([0, 0, rng.randint(1, 8192)])
        if decode == 0 and prefill == 0:
            decode = 1
        context = decode * rng.randint(100, 8000) + prefill + rng.randint(0, 20000) * (prefill > 0)
        batch = StepBatch(prefill, decode, context)
        step_ms = TRUE.step_ms(batch) * (1 + rng.uniform(-noise, noise))
        if i < warmup_outliers:
            step_ms *= 40
        elif i in late:
            step_ms *= 8
        lines.append(json.dumps({**batch.__dict__, "step_ms": round(step_ms, 4)}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def assert_recovers(profile: Profile, tolerance: float = 0.03) -> None:
    assert isinstance(profile.cost, LinearCost)
    for key in ("base_ms", "per_prefill_token_ms", "per_decode_request_ms", "per_context_token_ms"):
        fitted, true = getattr(profile.cost, key), getattr(TRUE, key)
        assert abs(fitted - true) <= tolerance * true, (key, fitted, true)


def test_fit_recovers_known_coefficients(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    log = tmp_path / "steps.jsonl"
    synthetic_log(log)
    base = Profile.load("h200-qwen3-32b")
    fitted = fit_profile(log, base, "h200-qwen3-32b-fitted")
    assert_recovers(fitted)
    assert fitted.name == "h200-qwen3-32b-fitted" and fitted.model == "linear"
    for key in ("block_size", "num_kv_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        assert getattr(fitted, key) == getattr(base, key)
    assert fitted.sources["step_log"] == str(log)
    assert "NNLS over 392 steps of 400" in fitted.sources["fit"]  # 5 warm-up and 3 outliers out
    assert "RMS residual" in fitted.sources["fit"]
    # it round-trips through a file like any other profile
    assert Profile.load(write(tmp_path, fitted.to_json(), "fitted.json")) == fitted


def test_fit_rejects_outliers_past_the_warmup_window(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    log = tmp_path / "steps.jsonl"
    synthetic_log(log, warmup_outliers=6, late_outliers=5, seed=11)
    assert_recovers(fit_profile(log, Profile.load("h200-qwen3-8b"), "fit", warmup_steps=0))


def test_fit_of_exact_data_is_exact(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    log = tmp_path / "steps.jsonl"
    synthetic_log(log, warmup_outliers=0, late_outliers=0, noise=0.0)
    assert_recovers(fit_profile(log, Profile.load("h200-qwen3-8b"), "fit", warmup_steps=0), tolerance=1e-3)


def test_fit_clips_a_coefficient_the_data_says_is_zero(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    rng = random.Random(3)
    lines = []
    for _ in range(200):
        batch = StepBatch(rng.randint(0, 4096), rng.randint(1, 256), rng.randint(1000, 900000))
        # decode requests make steps slightly *faster* here: NNLS must hold that coefficient at 0
        step_ms = (2.0 + 0.02 * batch.num_prefill_tokens - 0.001 * batch.num_decode_requests
                   + 2e-5 * batch.num_context_tokens)
        lines.append(json.dumps({**batch.__dict__, "step_ms": step_ms}))
    log = tmp_path / "steps.jsonl"
    log.write_text("\n".join(lines), encoding="utf-8")
    fitted = fit_profile(log, Profile.load("h200-qwen3-8b"), "fit", warmup_steps=0)
    assert isinstance(fitted.cost, LinearCost)
    assert fitted.cost.per_decode_request_ms == 0.0
    assert all(getattr(fitted.cost, k) >= 0 for k in ("base_ms", "per_prefill_token_ms", "per_context_token_ms"))


GOOD = '{"num_prefill_tokens": 0, "num_decode_requests": 3, "num_context_tokens": 900, "step_ms": 7.5}'


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ("{oops", "not valid JSON"),
        ("[1, 2, 3]", "must be a JSON object"),
        ('{"num_prefill_tokens": 0, "num_decode_requests": 3, "step_ms": 7.5}', "missing key 'num_context_tokens'"),
        ('{"num_prefill_tokens": -4, "num_decode_requests": 3, "num_context_tokens": 900, "step_ms": 7.5}',
         "'num_prefill_tokens' must be a non-negative int"),
        ('{"num_prefill_tokens": 0, "num_decode_requests": 2.5, "num_context_tokens": 900, "step_ms": 7.5}',
         "'num_decode_requests' must be a non-negative int"),
        ('{"num_prefill_tokens": 0, "num_decode_requests": 3, "num_context_tokens": 900, "step_ms": "fast"}',
         "'step_ms' must be a non-negative number"),
        ('{"num_prefill_tokens": 0, "num_decode_requests": 3, "num_context_tokens": 900, "step_ms": Infinity}',
         "not valid JSON"),
    ],
)
def test_malformed_step_log_line_is_named_by_number(tmp_path: Path, bad: str, match: str) -> None:
    log = tmp_path / "steps.jsonl"
    log.write_text("\n".join([GOOD, GOOD, "", bad, GOOD]) + "\n", encoding="utf-8")
    with pytest.raises(ProfileError, match=match) as info:
        fit_profile(log, Profile.load("h200-qwen3-8b"), "fit")
    assert f"{log}:4" in str(info.value)


def test_fit_needs_enough_steps_and_every_input_exercised(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    base = Profile.load("h200-qwen3-8b")
    log = tmp_path / "steps.jsonl"
    log.write_text("\n".join([GOOD] * 10), encoding="utf-8")
    with pytest.raises(ProfileError, match="usable steps"):
        fit_profile(log, base, "fit")
    decode_only = [json.dumps({"num_prefill_tokens": 0, "num_decode_requests": d, "num_context_tokens": 500 * d + d * d,
                               "step_ms": 5.0 + 0.1 * d}) for d in range(1, 60)]
    log.write_text("\n".join(decode_only), encoding="utf-8")
    with pytest.raises(ProfileError, match="cannot fit per_prefill_token_ms"):
        fit_profile(log, base, "fit")


@pytest.mark.vllm
def test_a_real_shim_step_log_fits_a_profile_the_replay_accepts(tmp_path: Path) -> None:
    """MeridianScheduler writes the step log (step_log_path) while the scripted engine runs it with
    a known linear step time; `meridian fit-profile` recovers that cost and writes a profile that
    `Profile.load` takes back."""
    from meridian.cli import main
    from meridian.demo.scripted import SCENARIO_MERIDIAN_CONFIG, Scenario, scenario_requests
    from meridian.offline.engine import EngineSpec, OfflineEngine, build_scheduler
    from meridian.offline.tiny import tiny_model_dir
    from meridian.vllm import MeridianScheduler

    log = tmp_path / "steps.jsonl"
    config = {**SCENARIO_MERIDIAN_CONFIG, "step_log_path": str(log)}
    spec = EngineSpec(model_dir=tiny_model_dir(tmp_path), num_blocks=200, additional_config={"meridian": config})
    scheduler = build_scheduler(MeridianScheduler, spec)

    def step_time_ms(shape: dict[str, int]) -> float:
        return 2.0 + 0.01 * shape["num_prefill_tokens"] + 0.3 * shape["num_decode_requests"]

    OfflineEngine(scheduler, scenario_requests(Scenario(num_requests=24), seed=3), step_time_ms=step_time_ms).run()
    scheduler.shutdown()
    records = [json.loads(line) for line in log.read_text().splitlines()]
    # Meridian's own share of each step, measured in the scheduler: wall time, so positive, and
    # far below the whole schedule + update of a step even on this machine.
    assert records and all(0.0 < r["meridian_ms"] < 50.0 for r in records)
    # Beside each step: what the model predicted for it before measuring it, the decode step the
    # plan judged deadlines with, and when; the engine's clock runs forward.
    assert all(r["predicted_ms"] > 0.0 and r["decode_step_ms"] > 0.0 and r["num_shed"] == 0 for r in records)
    assert all(a["t_ms"] <= b["t_ms"] for a, b in zip(records, records[1:]))
    assert all(r["num_running"] + r["num_waiting"] > 0 for r in records)
    out = tmp_path / "fitted.json"
    noise_out = tmp_path / "noise.json"
    assert main(["fit-profile", str(log), "--base", "h200-qwen3-8b", "--name", "cpu-fit", "--out", str(out),
                 "--noise-out", str(noise_out)]) == 0
    fitted = Profile.load(out)
    # The engine's step times were the cost itself: what the fit leaves is the log's rounding.
    from meridian.replay.noise import StepNoise

    assert StepNoise.load(noise_out).sigma < 0.01
    assert fitted.name == "cpu-fit" and fitted.model == "linear"
    assert fitted.num_kv_blocks == Profile.load("h200-qwen3-8b").num_kv_blocks
    assert fitted.step_time_ms(StepBatch(0, 10, 500)) == pytest.approx(2.0 + 0.3 * 10, rel=0.05)
    assert fitted.step_time_ms(StepBatch(100, 4, 400)) == pytest.approx(2.0 + 1.0 + 1.2, rel=0.05)
