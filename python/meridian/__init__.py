"""Meridian: phase- and SLO-aware scheduling for serving reasoning models on vLLM.

``import meridian`` loads only the Rust core (no vLLM, no CUDA); the vLLM scheduler lives in
``meridian.vllm`` and is selected with ``--scheduler-cls meridian.vllm.MeridianScheduler``.
"""

from __future__ import annotations

from meridian._core import Config, FinishedRequest, Meridian, StepPlan, __version__
from meridian.errors import (
    ConfigError,
    DuplicateRequestError,
    InvalidArgumentError,
    MeridianError,
    UnknownRequestError,
    UnknownSloClassError,
    UnsupportedVllmError,
)

__all__ = [
    "Config",
    "ConfigError",
    "DuplicateRequestError",
    "FinishedRequest",
    "InvalidArgumentError",
    "Meridian",
    "MeridianError",
    "StepPlan",
    "UnknownRequestError",
    "UnknownSloClassError",
    "UnsupportedVllmError",
    "__version__",
]
