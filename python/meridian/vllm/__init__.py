"""Meridian's vLLM integration: ``--scheduler-cls meridian.vllm.MeridianScheduler``.

Importing this package checks the installed vLLM against the supported range first, so an
unsupported version fails at start-up with a message that names both versions.
"""

from __future__ import annotations

from meridian._vllm_version import SUPPORTED_VLLM, check_vllm_version

check_vllm_version()

from meridian.vllm.scheduler import MeridianScheduler  # noqa: E402

__all__ = ["MeridianScheduler", "SUPPORTED_VLLM", "check_vllm_version"]
