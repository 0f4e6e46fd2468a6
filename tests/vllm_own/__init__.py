"""vLLM's own scheduler tests run against MeridianScheduler (``make check-vllm``,
``scripts/check_vllm.py``): the pytest plugins that run them here (``harness``: offline model
configs, the one-line report; ``substitute``: MeridianScheduler in place of vLLM's schedulers),
the by-design differences (``by_design.toml``) and the model configs vLLM's tests name
(``models/``, written for this check, no weights). Invariant: nothing here is collected by the
project's own test runs (no ``test_*.py``, no ``conftest.py``), and the product imports none of it.
"""
