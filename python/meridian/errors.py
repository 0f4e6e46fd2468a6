"""Meridian's exception hierarchy.

Every error the Rust core raises maps, variant by variant, onto one of these classes
(``crates/meridian-py/src/errors.rs``). Each also subclasses the builtin whose meaning fits, so
callers can catch either ``meridian.errors.ConfigError`` or plain ``ValueError``. ``TraceError`` and
``ProfileError`` are raised only by the Python replay tooling (``meridian.replay``), never by the core.
"""

from __future__ import annotations

__all__ = [
    "MeridianError",
    "ConfigError",
    "UnknownSloClassError",
    "DuplicateRequestError",
    "UnknownRequestError",
    "InvalidArgumentError",
    "RequestArgsError",
    "UnsupportedVllmError",
    "TraceError",
    "ProfileError",
]


class MeridianError(Exception):
    """Base class of every error Meridian raises."""


class ConfigError(MeridianError, ValueError):
    """A key or value of the ``meridian`` configuration is wrong; the message names the key."""


class UnknownSloClassError(MeridianError, ValueError):
    """A request asked for an SLO class the configuration does not define."""


class DuplicateRequestError(MeridianError, ValueError):
    """A request id was added twice."""


class UnknownRequestError(MeridianError, KeyError):
    """A handle does not refer to a live request."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable.
        return str(self.args[0]) if self.args else ""


class InvalidArgumentError(MeridianError, ValueError):
    """A per-request or per-step argument is out of range."""


class RequestArgsError(InvalidArgumentError):
    """A request's own ``vllm_xargs`` / ``extra_args`` for Meridian are wrong; the message names the
    argument (dotted into its JSON value). vLLM rejects that request alone, with HTTP 400."""


class UnsupportedVllmError(MeridianError, ImportError):
    """The installed vLLM is outside the range this Meridian release supports."""


class TraceError(MeridianError, ValueError):
    """A workload trace, or a replay option applied to one, is malformed; the message names the file
    and 1-based line (or the option) and the bad value."""


class ProfileError(ConfigError):
    """A replay hardware/model profile, or a step log fitted into one, is malformed; the message
    names the file (and 1-based line for a step log) and the key."""
