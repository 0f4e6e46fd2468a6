"""Pytest plugin: vLLM's own tests with MeridianScheduler wherever they build vLLM's scheduler.

vLLM's tests build their scheduler by name: their helpers (``create_scheduler`` in
``tests/v1/core/utils.py`` and ``tests/v1/kv_connector/unit/utils.py``, the offloading
connector's request runner) and a few tests call ``AsyncScheduler(...)`` or ``Scheduler(...)``
from their module's globals. Before each test this plugin rebinds those names, in every loaded
module of vLLM's ``tests`` package, to Meridian's classes:

- ``AsyncScheduler`` -> ``MeridianScheduler``, the class ``--scheduler-cls`` loads;
- ``Scheduler`` (vLLM's synchronous one) -> ``MeridianSyncScheduler``: MeridianScheduler with
  AsyncScheduler's own methods (its output placeholders; on 0.32 also its output bookkeeping)
  routed back to ``Scheduler``'s. The tests that build a sync ``Scheduler`` drive it
  synchronously and assert on the sync bookkeeping (tokens appended at ``update_from_output``,
  no placeholders); MeridianScheduler as it is would fail them for AsyncScheduler's reasons, not
  Meridian's. Every method Meridian itself overrides stays Meridian's, so what these tests check
  is Meridian's steering of vLLM's scheduler; what they do not check is MeridianScheduler in
  vLLM's synchronous engine loop (with async scheduling off vLLM still loads the async class).

Invariant: only these two names are rebound, by identity, so subclasses vLLM's tests build
themselves (the diffusion schedulers, a test's own subclass) stay vLLM's; the substitution
refuses to start (an error, not a quiet pass) when MeridianScheduler overrides a method that the
sync variant would route away, since that variant would then not be Meridian's code.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest

#: Test-package modules already rebound, by id of their dict (a module imported mid-run is
#: rebound before the next test).
_DONE: set[int] = set()
_CLASSES: dict[int, type] = {}


def meridian_classes() -> tuple[type, type, type, type]:
    """(vLLM's Scheduler, vLLM's AsyncScheduler, MeridianScheduler, MeridianSyncScheduler)."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from meridian.vllm.scheduler import MeridianScheduler

    routed = {
        name
        for name, value in vars(AsyncScheduler).items()
        if callable(value) and not (name.startswith("__") and name.endswith("__"))
    }
    clash = sorted(routed & set(vars(MeridianScheduler)))
    if clash:
        raise RuntimeError(
            f"MeridianScheduler overrides {clash}, which AsyncScheduler also defines: the sync variant "
            "(tests/vllm_own/substitute.py) would route them away from Meridian's code; decide how "
            "a sync Scheduler test should run Meridian before checking this release"
        )
    namespace: dict[str, Any] = {name: vars(Scheduler)[name] for name in routed if name in vars(Scheduler)}
    namespace["__doc__"] = "MeridianScheduler with AsyncScheduler's own methods routed to Scheduler's (tests only)."
    namespace["__module__"] = __name__
    sync_variant = type("MeridianSyncScheduler", (MeridianScheduler,), namespace)
    return Scheduler, AsyncScheduler, MeridianScheduler, sync_variant


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--meridian-scheduler",
        action="store_true",
        default=False,
        help="build MeridianScheduler wherever vLLM's tests build vLLM's Scheduler/AsyncScheduler",
    )


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("--meridian-scheduler"):
        return
    scheduler, async_scheduler, meridian, sync_variant = meridian_classes()
    # Meridian logs each request it sheds at INFO: captured with a failing test, the report
    # names the shed (tests/vllm_own/harness.py).
    logging.getLogger("meridian").setLevel(logging.INFO)
    _CLASSES.update({id(async_scheduler): meridian, id(scheduler): sync_variant})


def pytest_report_header(config: pytest.Config) -> str | None:
    if not _CLASSES:
        return None
    return (
        "vLLM's AsyncScheduler -> MeridianScheduler, Scheduler -> MeridianSyncScheduler in vLLM's tests "
        "(tests/vllm_own/substitute.py)"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    _rebind()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _rebind()


def _rebind() -> None:
    if not _CLASSES:
        return
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "tests" or name.startswith("tests.")):
            continue
        namespace = vars(module)
        if id(namespace) in _DONE:
            continue
        _DONE.add(id(namespace))
        for attr, value in list(namespace.items()):
            replacement = _CLASSES.get(id(value))
            if replacement is not None:
                namespace[attr] = replacement
