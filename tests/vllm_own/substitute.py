"""Pytest plugin: vLLM's own tests with MeridianScheduler wherever they build vLLM's scheduler.

vLLM's tests build their scheduler by name: their helpers (``create_scheduler`` in
``tests/v1/core/utils.py`` and ``tests/v1/kv_connector/unit/utils.py``, the offloading
connector's request runner) and a few tests call ``AsyncScheduler(...)`` or ``Scheduler(...)``
from their module's globals. Before each test this plugin rebinds those names, in every loaded
module of vLLM's ``tests`` package, to Meridian's classes:

- ``AsyncScheduler`` -> ``MeridianScheduler``, the class ``--scheduler-cls`` loads (on the
  tests' clock, below);
- ``Scheduler`` (vLLM's synchronous one) -> ``MeridianSyncScheduler``: MeridianScheduler with
  AsyncScheduler's own methods (its output placeholders; on 0.32 also its output bookkeeping)
  routed back to ``Scheduler``'s. The tests that build a sync ``Scheduler`` drive it
  synchronously and assert on the sync bookkeeping (tokens appended at ``update_from_output``,
  no placeholders); MeridianScheduler as it is would fail them for AsyncScheduler's reasons, not
  Meridian's. Every method Meridian itself overrides stays Meridian's, so what these tests check
  is Meridian's steering of vLLM's scheduler; what they do not check is MeridianScheduler in
  vLLM's synchronous engine loop (with async scheduling off vLLM still loads the async class).

Both run on the tests' own clock (``TestTimeClock``, installed as the instance's ``clock_ms``
right after construction; nothing else of Meridian's configuration changes, ``on_overload``
included). MeridianScheduler reads its deadlines on ``clock_ms`` against ``Request.arrival_time``,
which vLLM's frontend stamps with ``time.time()``: the wall clock, Meridian's default. The
tests stamp arrivals themselves, and what they stamp is their reading of that clock: most leave
vLLM's default (``time.time()`` at the ``Request``'s construction), while the priority tests give
synthetic stamps (``arrival_times=[1.0, 2.0, 3.0]``, seconds after the epoch) to order their
requests. Against the wall clock those requests are 56 years old on arrival, past every class's
TTFT target, and Meridian sheds them: a difference the harness made, not Meridian. So the clock
reads the test's time: each arrival stamp advanced by the wall time since its request was added,
the latest of these (it never runs backward once a request has been added; before the first, it
reads the wall clock, and the first arrival sets it). For a test that stamps with
``time.time()`` that is the wall clock less the moment between stamping and adding; for
synthetic stamps it is the test's time, in which a request stamped 0.0 and added when the newest
stamp is 9.0 has waited 9 s. Whatever Meridian does on that clock (a shed included) is its own.

Invariant: only these two names are rebound, by identity, so subclasses vLLM's tests build
themselves (the diffusion schedulers, a test's own subclass) stay vLLM's; the substitution
refuses to start (an error, not a quiet pass) when MeridianScheduler, or the test clock's hook
on ``add_request``, overrides a method that the sync variant would route away, since that
variant would then not be Meridian's code.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import pytest

#: Test-package modules already rebound, by id of their dict (a module imported mid-run is
#: rebound before the next test).
_DONE: set[int] = set()
_CLASSES: dict[int, type] = {}


class TestTimeClock:
    """Milliseconds on the test's own clock, read the way MeridianScheduler reads ``clock_ms``:
    each arrival stamp (``Request.arrival_time``, seconds) advanced by the wall time since its
    request was added, the latest of these; the wall clock before the first arrival."""

    def __init__(self) -> None:
        #: The stamp the clock runs from, and ``time.monotonic()`` when it was added.
        self._stamp_s: float | None = None
        self._added_at = 0.0

    def saw_arrival(self, arrival_s: float) -> None:
        if self._stamp_s is None or arrival_s > self.seconds():
            self._stamp_s, self._added_at = float(arrival_s), time.monotonic()

    def seconds(self) -> float:
        if self._stamp_s is None:
            return time.time()
        return self._stamp_s + (time.monotonic() - self._added_at)

    def __call__(self) -> float:
        return self.seconds() * 1000.0


class OnTestTime:
    """Mixin ahead of MeridianScheduler: its ``clock_ms`` is a ``TestTimeClock``, which sees each
    request's arrival stamp as the test adds it; the rest is MeridianScheduler's own."""

    clock_ms: TestTimeClock

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clock_ms = TestTimeClock()

    def add_request(self, request: Any) -> None:
        self.clock_ms.saw_arrival(request.arrival_time)
        super().add_request(request)  # type: ignore[misc]


def meridian_classes() -> tuple[type, type, type, type]:
    """(vLLM's Scheduler, vLLM's AsyncScheduler, MeridianScheduler on the test's clock, and
    MeridianSyncScheduler on it)."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from meridian.vllm.scheduler import MeridianScheduler

    routed = {
        name
        for name, value in vars(AsyncScheduler).items()
        if callable(value) and not (name.startswith("__") and name.endswith("__"))
    }
    clash = sorted(routed & (set(vars(MeridianScheduler)) | set(vars(OnTestTime))))
    if clash:
        raise RuntimeError(
            f"MeridianScheduler overrides {clash}, which AsyncScheduler also defines: the sync variant "
            "(tests/vllm_own/substitute.py) would route them away from Meridian's code; decide how "
            "a sync Scheduler test should run Meridian before checking this release"
        )
    on_test_time = type(
        "MeridianScheduler",
        (OnTestTime, MeridianScheduler),
        {"__doc__": "MeridianScheduler on the test's clock (tests only).", "__module__": __name__},
    )
    namespace: dict[str, Any] = {name: vars(Scheduler)[name] for name in routed if name in vars(Scheduler)}
    namespace["__doc__"] = (
        "MeridianScheduler on the test's clock, with AsyncScheduler's own methods routed to Scheduler's (tests only)."
    )
    namespace["__module__"] = __name__
    sync_variant = type("MeridianSyncScheduler", (on_test_time,), namespace)
    return Scheduler, AsyncScheduler, on_test_time, sync_variant


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
        "vLLM's AsyncScheduler -> MeridianScheduler, Scheduler -> MeridianSyncScheduler in vLLM's tests, "
        "both on the test's clock: its arrival stamps advanced by wall time (tests/vllm_own/substitute.py)"
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
