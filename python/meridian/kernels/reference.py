"""NumPy reference of the CUDA kernels: the CPU path and the oracle the kernels are checked against.

``logits_stats_reference`` computes, per row of a logits matrix, the log-sum-exp, the softmax
entropy in nats, and for each target token id its probability and rank (number of tokens with a
strictly larger logit), in float64. Tokens at -inf carry no mass; an all -inf row gives
lse = -inf, entropy = 0 and probabilities 0. ``update_signals_reference`` applies one step's rows
to per-slot signal state exactly as ``cuda/signals.cu`` does (sequentially within a slot).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass
class LogitsStats:
    """Per-row statistics: ``lse``, ``entropy`` [rows]; ``target_prob``, ``target_rank`` [rows, targets]."""

    lse: npt.NDArray[np.float64]
    entropy: npt.NDArray[np.float64]
    target_prob: npt.NDArray[np.float64]
    target_rank: npt.NDArray[np.int64]


def logits_stats_reference(logits: npt.ArrayLike, target_ids: npt.ArrayLike) -> LogitsStats:
    """Float64 statistics of each row of ``logits`` ([rows, vocab]) for ``target_ids`` ([targets])."""
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"logits must be 2-D [rows, vocab], got shape {x.shape}")
    targets = np.asarray(target_ids, dtype=np.int64).reshape(-1)
    vocab = x.shape[1]
    if np.any((targets < 0) | (targets >= vocab)):
        raise ValueError(f"target ids must lie in [0, {vocab}), got {targets.tolist()}")
    finite = x > -np.inf
    any_mass = np.asarray(finite.any(axis=1))
    m = np.where(any_mass, np.max(np.where(finite, x, -np.inf), axis=1), 0.0)
    shifted = np.where(finite, x - m[:, None], 0.0)
    e = np.where(finite, np.exp(shifted), 0.0)
    s = e.sum(axis=1)
    u = (e * shifted).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(any_mass, m + np.log(np.where(any_mass, s, 1.0)), -np.inf)
        entropy = np.where(
            any_mass, np.maximum(np.log(np.where(any_mass, s, 1.0)) - u / np.where(any_mass, s, 1.0), 0.0), 0.0
        )
    target_logit = x[:, targets]
    with np.errstate(invalid="ignore"):
        prob = np.where(any_mass[:, None] & (target_logit > -np.inf), np.exp(target_logit - lse[:, None]), 0.0)
    rank = (
        (x[:, None, :] > target_logit[:, :, None]).sum(axis=2) if len(targets) else np.zeros((x.shape[0], 0), np.int64)
    )
    return LogitsStats(lse=lse, entropy=entropy, target_prob=prob, target_rank=rank.astype(np.int64))
