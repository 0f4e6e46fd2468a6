"""Test-only: let vLLM 0.34+'s x86 triton-cpu check through, so its scheduler's Python runs here.

vLLM 0.34's CPU platform refuses to build any ``VllmConfig`` on an x86 CPU without triton-cpu
(``CpuPlatform.check_and_update_config``: "vLLM on x86 CPUs requires Triton (triton-cpu)"), and
triton-cpu is not on PyPI. The in-process layers (the scheduler, the waiting queues, the KV
connectors' scheduler side, the offline engine's loop) run no kernel, so for them the check guards
nothing; this plugin answers it "Triton present" for the one call, and only where it would refuse
(vLLM 0.34 or newer, x86, no Triton). Everything else the platform decides is untouched, and
``HAS_TRITON`` is restored as soon as the check returns: vLLM's Triton placeholders, the model
runner choice (``uses_standalone_cpu_model_runner``) and every kernel path still see no Triton.

What it leaves untested on 0.34, by construction: anything that runs a model (vLLM's 0.34 CPU model
runner needs triton-cpu's kernels; the CUDA wheel unpacked here has no CPU kernels either), and
whether the platform's remaining config adjustments differ with triton-cpu installed (they read
no Triton today). ``tests/conftest.py`` loads it for every test; ``make check-vllm`` loads it for
vLLM's own scheduler tests. The product never imports it.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: The first release whose CPU platform refuses x86 without triton-cpu.
FIRST_REFUSING = (0, 34)


def _version() -> tuple[int, int] | None:
    if importlib.util.find_spec("vllm") is None:
        return None
    import vllm

    major, minor = (int(part) for part in str(vllm.__version__).split(".")[:2])
    return major, minor


def needed() -> bool:
    """Whether the installed vLLM would refuse this machine for want of triton-cpu."""
    version = _version()
    if version is None or version < FIRST_REFUSING:
        return False
    from vllm.platforms.cpu import CpuPlatform
    from vllm.platforms.interface import CpuArchEnum
    from vllm.triton_utils import HAS_TRITON

    return CpuPlatform.get_cpu_architecture() == CpuArchEnum.X86 and not HAS_TRITON


@contextmanager
def _triton_reported_present() -> Iterator[None]:
    import vllm.triton_utils as triton_utils

    was = triton_utils.HAS_TRITON
    triton_utils.HAS_TRITON = True
    try:
        yield
    finally:
        triton_utils.HAS_TRITON = was


def install() -> bool:
    """Wraps ``CpuPlatform.check_and_update_config`` where ``needed()``; returns whether it did."""
    if not needed():
        return False
    from vllm.platforms.cpu import CpuPlatform

    original = CpuPlatform.check_and_update_config.__func__  # type: ignore[attr-defined]
    if getattr(original, "_triton_let_through", False):
        return True

    @functools.wraps(original)
    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        with _triton_reported_present():
            original(cls, vllm_config)

    check_and_update_config._triton_let_through = True  # type: ignore[attr-defined]
    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[method-assign,assignment]
    return True


#: Whether ``install()`` wrapped the check in this process.
INSTALLED = False


def pytest_configure(config: Any) -> None:
    global INSTALLED
    INSTALLED = install()


def pytest_report_header(config: Any) -> str | None:
    if not INSTALLED:
        return None
    return "vLLM's x86 triton-cpu check let through for the scheduler's Python (tests/triton_let_through.py)"
