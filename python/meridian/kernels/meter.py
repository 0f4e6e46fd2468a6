"""Per-row thinking-control signals of a logits matrix, for the logits processor: the entropy in
nats and the reasoning-end token's probability and rank. ``CpuMeter`` computes them at once with
torch in float32 (checked against the NumPy float64 reference); ``CudaMeter`` launches the ``logits_stats`` kernel on a side stream and hands results back
only once they have arrived. Both take rows with caller tags and return ``(tag, signals)`` pairs
from ``collect``. Invariant: ``collect`` never waits for the device, and every submitted row
comes back exactly once, with its own tag.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: (entropy in nats, end-token probability, end-token rank) of one logits row.
Signals = tuple[float, float, int]
#: Whatever the caller pairs with a measured row (the processor: its request and output position).
Tag = Any


class CpuMeter:
    """Signals of selected rows computed at once with torch on the host, in float32 (the NumPy
    float64 reference is the tests' oracle; copying a [rows, 151,936] block to float64 would cost
    more than the step)."""

    def __init__(self) -> None:
        self._ready: list[tuple[Tag, Signals]] = []

    def submit(self, logits: torch.Tensor, rows: list[int], tags: list[Tag], end_token_id: int) -> None:
        import torch

        if not rows:
            return
        x = logits[rows].float()
        lse = torch.logsumexp(x, dim=1)
        finite = torch.isfinite(x)
        shifted = torch.where(finite, x - lse[:, None], torch.zeros_like(x))
        p = torch.where(finite, shifted.exp(), torch.zeros_like(x))
        entropy = (-(p * shifted).sum(dim=1)).clamp_min(0.0)
        end_logit = x[:, end_token_id]
        end_prob = torch.where(torch.isfinite(end_logit), (end_logit - lse).exp(), torch.zeros_like(end_logit))
        end_rank = (x > end_logit[:, None]).sum(dim=1)
        for tag, h, q, r in zip(tags, entropy.tolist(), end_prob.tolist(), end_rank.tolist()):
            self._ready.append((tag, (h, q, int(r))))

    def collect(self) -> list[tuple[Tag, Signals]]:
        ready, self._ready = self._ready, []
        return ready


class CudaMeter:
    """Signals of selected rows from the ``logits_stats`` kernel, launched on a side stream that
    waits for the logits (an event, no device synchronisation) and copied to pinned host memory.
    ``collect`` only takes what has finished (``Event.query``), so the host never waits for the
    device; results are tagged, so arriving a step later than usual does not misplace them."""

    def __init__(self, device: torch.device) -> None:
        import torch

        self._device = device
        self._stream = torch.cuda.Stream(device)
        self._in_flight: list[tuple[list[Tag], torch.Tensor, torch.cuda.Event]] = []

    def submit(self, logits: torch.Tensor, rows: list[int], tags: list[Tag], end_token_id: int) -> None:
        import torch

        from meridian.kernels.launch import logits_stats

        if not rows:
            return
        produced = torch.cuda.Event()
        produced.record(torch.cuda.current_stream(self._device))
        with torch.cuda.stream(self._stream):
            self._stream.wait_event(produced)
            index = torch.tensor(rows, dtype=torch.long).to(self._device, non_blocking=True)
            selected = logits.index_select(0, index)
            targets = torch.tensor([end_token_id], dtype=torch.int32).to(self._device, non_blocking=True)
            stats = logits_stats(selected, targets, stream=self._stream)
            packed = torch.stack([stats.entropy, stats.target_prob[:, 0], stats.target_rank[:, 0].float()], dim=1)
            host = torch.empty(packed.shape, dtype=torch.float32, pin_memory=True)
            host.copy_(packed, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._stream)
        # The sampler may free the logits while the side stream still reads them.
        logits.record_stream(self._stream)
        self._in_flight.append((tags, host, done))

    def collect(self) -> list[tuple[Tag, Signals]]:
        ready: list[tuple[Tag, Signals]] = []
        while self._in_flight and self._in_flight[0][2].query():
            tags, host, _done = self._in_flight.pop(0)
            ready.extend((tag, (v[0], v[1], int(v[2]))) for tag, v in zip(tags, host.tolist()))
        return ready
