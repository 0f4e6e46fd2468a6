"""The engine's queue, carried to the API server for admission at arrival.

vLLM runs the scheduler in the engine-core process and reads each request first in the API server
(a parent of the engine core with one API server; a sibling under the launcher with several, or
with data-parallel ranks). The scheduler publishes what a new request would meet — the core's
``arrival_snapshot``, JSON text — as a small file in Meridian's private bus folder
(``meridian.vllm.bus.private_dir``), named by the engine core's parent pid and its own pid and
rewritten at most every ``WRITE_PERIOD_S`` while it steps; the API server's ``ArrivalReader``
finds the files of its own engines by that parent pid (its own pid, or its parent's), re-reads a
file only when it changed, and hands the texts to the core's ``ArrivalGate``, which decides.
Invariant: this module carries text and decides nothing; nothing here blocks either side or
raises into vLLM — an unwritable folder or a torn read leaves the gate with older snapshots,
which the core stops trusting once they are ``STALE_SNAPSHOT_MS`` old.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from meridian.vllm.bus import bus_dir, private_dir, unsafe_dir_problem

logger = logging.getLogger("meridian")

#: Least seconds between two writes of an engine's snapshot: fresh enough that a burst meets the
#: queue the previous requests built (the gate also counts what it admitted meanwhile), cheap
#: enough at a few hundred steps a second.
WRITE_PERIOD_S = 0.02
#: Least seconds between two looks at the snapshot files from the API server.
READ_PERIOD_S = 0.01
#: Seconds the API server trusts its list of engine files before it looks for new ones.
RESCAN_PERIOD_S = 1.0
_PREFIX = "meridian-arrival-"


def snapshot_path(parent_pid: int, pid: int) -> Path:
    return bus_dir() / f"{_PREFIX}{parent_pid}-{pid}.json"


class ArrivalPublisher:
    """The scheduler's end: writes the engine's snapshot when one is due."""

    def __init__(self) -> None:
        self._path = snapshot_path(os.getppid(), os.getpid())
        self._written_at = 0.0
        self._failed = False
        try:
            private_dir(self._path.parent)
        except Exception as exc:  # noqa: BLE001 - admission at arrival is off, the engine serves on
            logger.warning("meridian: admission at arrival is off: %s", exc)
            self._failed = True

    def publish(self, snapshot: Callable[[], str], *, force: bool = False) -> None:
        """Writes ``snapshot()`` when ``WRITE_PERIOD_S`` has passed since the last write (or
        ``force``: the engine goes idle and will not step again soon)."""
        now = time.monotonic()
        if self._failed or (not force and now - self._written_at < WRITE_PERIOD_S):
            return
        self._written_at = now
        tmp = self._path.with_suffix(f".{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(snapshot())
            os.replace(tmp, self._path)
        except OSError as exc:
            logger.warning("meridian: cannot write %s (%s); admission at arrival is off", self._path, exc)
            self._failed = True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._path.unlink(missing_ok=True)


class ArrivalReader:
    """The API server's end: the snapshot texts of the engines behind this server."""

    def __init__(self, parent_pids: tuple[int, ...] | None = None) -> None:
        self._parent_pids = parent_pids or (os.getpid(), os.getppid())
        self._paths: list[Path] = []
        self._scanned_at = -RESCAN_PERIOD_S
        self._read_at = -READ_PERIOD_S
        self._texts: dict[Path, tuple[int, str]] = {}
        self._trusted: bool | None = None

    def texts(self) -> list[str] | None:
        """The current texts, or ``None`` when nothing changed since the last call."""
        now = time.monotonic()
        if now - self._read_at < READ_PERIOD_S or not self._folder_trusted():
            return None
        self._read_at = now
        if now - self._scanned_at >= RESCAN_PERIOD_S:
            self._scanned_at = now
            self._paths = self._scan()
        changed = False
        for path in self._paths:
            try:
                mtime_ns = path.stat().st_mtime_ns
                if path in self._texts and self._texts[path][0] == mtime_ns:
                    continue
                self._texts[path] = (mtime_ns, path.read_text())
                changed = True
            except OSError:
                changed = changed or self._texts.pop(path, None) is not None
        for gone in set(self._texts) - set(self._paths):
            del self._texts[gone]
            changed = True
        return [text for _, text in self._texts.values()] if changed else None

    def _scan(self) -> list[Path]:
        folder = bus_dir()
        prefixes = tuple(f"{_PREFIX}{pid}-" for pid in self._parent_pids)
        try:
            return sorted(folder / n for n in os.listdir(folder) if n.startswith(prefixes) and n.endswith(".json"))
        except OSError:
            return []

    def _folder_trusted(self) -> bool:
        """Another local user's files never steer admission: the folder must be this user's alone."""
        if self._trusted is None:
            try:
                problem = unsafe_dir_problem(bus_dir())
            except OSError:
                return False  # not there yet: the engine creates it
            self._trusted = problem is None
            if problem is not None:
                logger.warning("meridian: the bus folder %s %s; admission at arrival is off", bus_dir(), problem)
        return self._trusted
