"""Thinking-control measurements: the CUDA kernel (``cuda/logits_stats.cu``, embedded in the
extension and compiled at run time by CuPy), its NumPy float64 reference (the test oracle), and
the meters the logits processor uses (torch on CPU, the kernel on a side stream on GPU).
``import meridian.kernels`` needs neither CuPy nor torch; the launchers import them on first use."""

from meridian.kernels.reference import LogitsStats, logits_stats_reference

KERNEL_FILES = ("logits_stats.cu",)

__all__ = ["KERNEL_FILES", "LogitsStats", "logits_stats_reference"]
