"""The wheel `scripts/setup.sh` builds with maturin: one abi3 wheel carrying the extension, its
hand-written stub, the py.typed marker and the whole package."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

WHEELS = Path(__file__).resolve().parents[2] / "build" / "wheels"


def test_one_abi3_wheel_with_extension_stub_and_marker() -> None:
    wheels = sorted(WHEELS.glob("meridian_sched-*.whl"))
    if not wheels:
        pytest.skip("no wheel in build/wheels (run scripts/setup.sh or `make wheel` first)")
    assert len(wheels) == 1, wheels
    assert "-abi3-" in wheels[0].name
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    assert any(n.startswith("meridian/_core.") and n.endswith(".so") for n in names), names
    for required in (
        "meridian/_core.pyi", "meridian/py.typed", "meridian/vllm/scheduler.py", "meridian/errors.py",
        "meridian/replay/data/reasoning_classes.json", "meridian/replay/data/ATTRIBUTION.md",
        "meridian/replay/profiles/h200-qwen3-32b.json",
    ):
        assert required in names, required
    for layer in ("vllm", "offline", "replay", "demo", "kernels"):
        assert f"meridian/{layer}/__init__.py" in names, layer


def test_the_wheel_ships_what_serves_replays_or_demos_and_nothing_else() -> None:
    wheels = sorted(WHEELS.glob("meridian_sched-*.whl"))
    if not wheels:
        pytest.skip("no wheel in build/wheels (run scripts/setup.sh or `make wheel` first)")
    names = zipfile.ZipFile(wheels[0]).namelist()
    shipped = [n for n in names if n.startswith("meridian/")]
    assert not [n for n in shipped if n.startswith("meridian/testing/")], "no test helpers in the wheel"
    assert not [n for n in shipped if "train_tiny" in n], "the tiny model's trainer is a script, not the product"
    assert not [n for n in shipped if n.startswith(("tests/", "conftest"))]
