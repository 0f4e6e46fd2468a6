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
    any_mass = finite.any(axis=1)
    m = np.where(any_mass, np.max(np.where(finite, x, -np.inf), axis=1), 0.0)
    shifted = np.where(finite, x - m[:, None], 0.0)
    e = np.where(finite, np.exp(shifted), 0.0)
    s = e.sum(axis=1)
    u = (e * shifted).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(any_mass, m + np.log(np.where(any_mass, s, 1.0)), -np.inf)
        entropy = np.where(any_mass, np.maximum(np.log(np.where(any_mass, s, 1.0)) - u / np.where(any_mass, s, 1.0), 0.0), 0.0)
    target_logit = x[:, targets]
    with np.errstate(invalid="ignore"):
        prob = np.where(any_mass[:, None] & (target_logit > -np.inf), np.exp(target_logit - lse[:, None]), 0.0)
    rank = (x[:, None, :] > target_logit[:, :, None]).sum(axis=2) if len(targets) else np.zeros((x.shape[0], 0), np.int64)
    return LogitsStats(lse=lse, entropy=entropy, target_prob=prob, target_rank=rank.astype(np.int64))


@dataclass
class SignalState:
    """Per-slot thinking-control state (one entry per request slot)."""

    eat_mean: npt.NDArray[np.float32]
    eat_var: npt.NDArray[np.float32]
    eat_count: npt.NDArray[np.int32]
    rpdi_num_tokens: npt.NDArray[np.int32]
    rpdi_num_high: npt.NDArray[np.int32]
    rpdi_local_rate: npt.NDArray[np.float32]

    @classmethod
    def zeros(cls, num_slots: int) -> SignalState:
        f, i = np.zeros(num_slots, np.float32), np.zeros(num_slots, np.int32)
        return cls(f.copy(), f.copy(), i.copy(), i.copy(), i.copy(), f.copy())


def update_signals_reference(
    state: SignalState,
    entropy: npt.ArrayLike,
    row_is_probe: npt.ArrayLike,
    slot_ids: npt.ArrayLike,
    row_offsets: npt.ArrayLike,
    *,
    eat_alpha: float,
    high_entropy_nats: float,
    rpdi_alpha: float,
) -> None:
    """Applies one step's rows to ``state`` in place, slot by slot, rows in order (float32 math)."""
    ent = np.asarray(entropy, dtype=np.float32)
    probe = np.asarray(row_is_probe, dtype=bool)
    slots = np.asarray(slot_ids, dtype=np.int64)
    offsets = np.asarray(row_offsets, dtype=np.int64)
    if len(offsets) != len(slots) + 1 or np.any(np.diff(offsets) < 0) or (len(offsets) and offsets[-1] > len(ent)):
        raise ValueError("row_offsets must be non-decreasing, one longer than slot_ids, and within the rows")
    if len(set(slots.tolist())) != len(slots):
        raise ValueError("slot_ids must be distinct within one update")
    a, ra, thr = np.float32(eat_alpha), np.float32(rpdi_alpha), np.float32(high_entropy_nats)
    one = np.float32(1.0)
    for i, slot in enumerate(slots):
        for r in range(offsets[i], offsets[i + 1]):
            x = ent[r]
            if not abs(x) <= np.float32(32.0):
                continue  # non-finite or impossible entropy: skipped, as the kernel and the core do
            if probe[r]:
                if state.eat_count[slot] == 0:
                    state.eat_mean[slot], state.eat_var[slot] = x, np.float32(0.0)
                else:
                    d = np.float32(x - state.eat_mean[slot])
                    state.eat_mean[slot] = np.float32(state.eat_mean[slot] + a * d)
                    state.eat_var[slot] = np.float32((one - a) * (state.eat_var[slot] + a * d * d))
                state.eat_count[slot] += 1
            else:
                high = np.float32(1.0) if x > thr else np.float32(0.0)
                state.rpdi_num_tokens[slot] += 1
                state.rpdi_num_high[slot] += int(high)
                state.rpdi_local_rate[slot] = np.float32(
                    state.rpdi_local_rate[slot] + ra * (high - state.rpdi_local_rate[slot])
                )
