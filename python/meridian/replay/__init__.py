"""Trace-driven replay of recorded or synthesized workloads through Meridian."""
