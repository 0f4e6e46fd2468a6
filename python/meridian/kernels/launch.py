"""Launch the CUDA kernels on torch tensors through CuPy.

The sources come from the extension (``meridian._core.kernel_source``), are compiled once per
device by CuPy's ``RawModule`` (NVRTC) and cached. Launches go on the torch stream the caller
names (default: torch's current stream) through ``cupy.cuda.ExternalStream``; every buffer is a
torch tensor passed as a raw device pointer, so CuPy's own memory pool never allocates (vLLM's
memory budget stays whole) and a launch costs little host time. Invariant: nothing here
synchronises the device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meridian._core import kernel_source
from meridian.errors import InvalidArgumentError

if TYPE_CHECKING:
    import torch

LOGITS_STATS_THREADS = 1024
MAX_TARGETS = 8
NVRTC_BASE_OPTIONS = ("-std=c++17",)
#: Per kernel file. logits_stats.cu keeps FMA contraction: its results are checked to 1e-6
#: relative, and its bandwidth was measured so.
NVRTC_OPTIONS: dict[str, tuple[str, ...]] = {
    "logits_stats.cu": NVRTC_BASE_OPTIONS,
}


@functools.cache
def _module(name: str, device_id: int) -> Any:
    import cupy

    with cupy.cuda.Device(device_id):
        module = cupy.RawModule(code=kernel_source(name), options=NVRTC_OPTIONS[name], backend="nvrtc")
        module.compile()
    return module


def _function(name: str, entry: str, device_id: int) -> Any:
    return _module(name, device_id).get_function(entry)


def _ptr(t: torch.Tensor) -> Any:
    """A device pointer as the 8-byte kernel argument CuPy packs for a ``uint64`` scalar: no
    CuPy array is built per launch, which keeps the host cost of a launch small."""
    import numpy as np

    return np.uint64(t.data_ptr())


@functools.lru_cache(maxsize=64)
def _cupy_stream(stream_ptr: int, device_id: int) -> Any:
    import cupy

    return cupy.cuda.ExternalStream(stream_ptr, device_id)


@dataclass
class DeviceLogitsStats:
    """Kernel outputs on the device: ``lse``, ``entropy`` [rows] float32; ``target_prob`` [rows,
    targets] float32; ``target_rank`` [rows, targets] int32."""

    lse: torch.Tensor
    entropy: torch.Tensor
    target_prob: torch.Tensor
    target_rank: torch.Tensor

    @classmethod
    def empty(cls, num_rows: int, num_targets: int, device: torch.device) -> DeviceLogitsStats:
        import torch

        f32 = torch.float32
        return cls(
            lse=torch.empty(num_rows, dtype=f32, device=device),
            entropy=torch.empty(num_rows, dtype=f32, device=device),
            target_prob=torch.empty(num_rows, num_targets, dtype=f32, device=device),
            target_rank=torch.empty(num_rows, num_targets, dtype=torch.int32, device=device),
        )


def logits_stats(
    logits: torch.Tensor,
    target_ids: torch.Tensor,
    *,
    out: DeviceLogitsStats | None = None,
    stream: torch.cuda.Stream | None = None,
) -> DeviceLogitsStats:
    """Launches the one-pass statistics kernel over the rows of ``logits`` ([rows, vocab], float32
    or bfloat16, unit stride along the vocabulary) for ``target_ids`` (int32, at most 8)."""
    import cupy
    import numpy as np
    import torch

    if logits.dim() != 2 or logits.stride(1) != 1:
        raise InvalidArgumentError(
            f"logits must be 2-D with unit stride along the vocabulary, got {tuple(logits.shape)}"
        )
    if logits.dtype not in (torch.float32, torch.bfloat16):
        raise InvalidArgumentError(f"logits must be float32 or bfloat16, got {logits.dtype}")
    if target_ids.dtype != torch.int32 or target_ids.dim() != 1 or target_ids.numel() > MAX_TARGETS:
        raise InvalidArgumentError(f"target_ids must be a 1-D int32 tensor of at most {MAX_TARGETS} ids")
    rows, vocab = logits.shape
    num_targets = target_ids.numel()
    out = out or DeviceLogitsStats.empty(rows, num_targets, logits.device)
    vector = 4 if logits.dtype == torch.float32 else 8
    aligned = logits.stride(0) % vector == 0 and logits.data_ptr() % 16 == 0
    suffix = "f32" if logits.dtype == torch.float32 else "bf16"
    most_targets = 2 if num_targets <= 2 else MAX_TARGETS
    entry = f"logits_stats_{suffix}" + ("" if aligned else "_scalar") + f"_k{most_targets}"
    device_id = logits.device.index or 0
    kernel = _function("logits_stats.cu", entry, device_id)
    torch_stream = stream or torch.cuda.current_stream(logits.device)
    if rows == 0:
        return out
    with cupy.cuda.Device(device_id), _cupy_stream(torch_stream.cuda_stream, device_id):
        kernel(
            (rows,),
            (LOGITS_STATS_THREADS,),
            (
                _ptr(logits),
                np.int64(logits.stride(0)),
                np.int32(vocab),
                _ptr(target_ids),
                np.int32(num_targets),
                _ptr(out.lse),
                _ptr(out.entropy),
                _ptr(out.target_prob),
                _ptr(out.target_rank),
            ),
        )
    return out
