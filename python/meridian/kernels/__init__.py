"""Thinking-control signals: the CUDA kernels (``cuda/*.cu``, embedded in the extension and
compiled at run time by CuPy) and their NumPy reference, which is both the CPU path and the
kernels' test oracle. ``import meridian.kernels`` needs neither CuPy nor torch; the launchers
import them on first use."""

from meridian.kernels.reference import LogitsStats, SignalState, logits_stats_reference, update_signals_reference

KERNEL_FILES = ("logits_stats.cu", "signals.cu")

__all__ = ["KERNEL_FILES", "LogitsStats", "SignalState", "logits_stats_reference", "update_signals_reference"]
