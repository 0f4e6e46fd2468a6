"""Meridian's vLLM integration: everything that runs inside vLLM.

``--scheduler-cls meridian.vllm.MeridianScheduler`` (``scheduler``, with its waiting ``queue``,
its EAT ``probes`` and the ``convert``-ers between vLLM's objects and the core's values),
``--logits-processors meridian.vllm.thinking:MeridianThinkingProcessor`` (``thinking``),
``--middleware meridian.vllm.frontend.RequestArgsCheck`` (``frontend``: the request arguments
checked in the API server), the ``bus`` between the first two, ``config`` (vLLM's configuration,
tokenizer and reasoning markers, read once) and ``names`` (every name that crosses a process or
the HTTP API). Each module that imports vLLM checks the installed version first; this package
itself and ``names`` load no vLLM, so the layers above can read the names and reach the scheduler
lazily.
"""

from __future__ import annotations

from typing import Any

from meridian.vllm._version import SUPPORTED_VLLM, check_vllm_version

__all__ = ["MeridianScheduler", "SUPPORTED_VLLM", "check_vllm_version"]


def __getattr__(name: str) -> Any:
    # vLLM resolves `meridian.vllm.MeridianScheduler` by importing this package and reading the
    # attribute: the scheduler (and vLLM) load only then.
    if name == "MeridianScheduler":
        from meridian.vllm.scheduler import MeridianScheduler

        return MeridianScheduler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
