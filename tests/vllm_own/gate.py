"""Pytest plugin (and helper): Meridian's version gate widened to the installed vLLM, for a check.

``meridian.vllm`` refuses every vLLM outside ``SUPPORTED_VLLM`` at import, so checking a release
before adopting it would stop at that refusal. ``make check-vllm`` loads this plugin where the
release under check is outside the range: it extends the range's upper end to that release for
this process only, and says so in pytest's header. Invariant: it changes nothing when the
installed vLLM is already supported, and never touches the product's files; adopting a release
still means widening ``SUPPORTED_VLLM`` in ``python/meridian/vllm/_version.py`` by hand.
"""

from __future__ import annotations

import importlib.util

import pytest

#: The range before this process widened it, where it did.
_WIDENED_FROM: list[tuple[tuple[int, int], tuple[int, int]]] = []


def installed_minor() -> tuple[int, int] | None:
    if importlib.util.find_spec("vllm") is None:
        return None
    import vllm

    major, minor = (int(part) for part in str(vllm.__version__).split(".")[:2])
    return major, minor


def widen() -> bool:
    """Extends ``SUPPORTED_VLLM`` to the installed vLLM where it is newer; returns whether it did.
    Must run before anything imports ``meridian.vllm``'s vLLM-facing modules (their import runs
    the check once and caches it)."""
    from meridian.vllm import _version

    installed = installed_minor()
    low, high = _version.SUPPORTED_VLLM
    if installed is None or installed <= high:
        return False
    _WIDENED_FROM.append((low, high))
    _version.SUPPORTED_VLLM = (low, installed)
    _version.require_supported_vllm.cache_clear()
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    widen()


def pytest_report_header(config: pytest.Config) -> str | None:
    if not _WIDENED_FROM:
        return None
    (low, high), now = _WIDENED_FROM[0], installed_minor()
    return (
        f"Meridian's version gate widened for this check: SUPPORTED_VLLM {low}-{high} -> {low}-{now} "
        "(tests/vllm_own/gate.py; adopting the release widens it in python/meridian/vllm/_version.py)"
    )
