"""The channel between ``MeridianScheduler`` and ``MeridianThinkingProcessor``.

vLLM builds the scheduler in the engine-core process and the logits processors in the worker
that runs the model. In vLLM's default single-GPU layout (``UniProcExecutor``) that worker lives
in the engine-core process; on the CPU build (``MultiprocExecutor``, forced by the platform) and
with tensor parallelism it is a child process of it. Three things cross: the worker asks for EAT
probes (parent ``req_id`` and how many of its output tokens the probe covers; the scheduler
builds the probe from the parent it holds) and reports each request whose reasoning a rule ended
(the rule and the thinking tokens, for the request log), and the scheduler publishes each
class's recent TTFAT attainment (the load-aware budget) and the requests whose thinking it ends
to answer in time (``on_overload: degrade``). In one process both go through memory; across
processes the worker finds the engine core by its parent pid: probes and stops travel as
datagrams on a Unix socket the scheduler binds, attainment and endings as a small JSON file it
rewrites when a value changes (at most ten times a second) and the worker re-reads at most four
times a second. Invariant: nothing here blocks either side; a lost probe request only delays an
EAT decision or a log field, a missing attainment only means no tightening, a late ending only
ends a thinking later (the scheduler's margin allows for the file's delay). The folder they live
in is this user's alone (``private_dir``): in a folder other local users can write, one could
bind the socket or plant the file under the pid-derived name first and steer the scheduler.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
import tempfile
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from meridian.errors import ConfigError
from meridian.vllm.names import BUS_DIR_ENV

logger = logging.getLogger("meridian")

#: Least seconds between two writes of the attainment file (it changes only when a request
#: completes; a busy server completes many a second).
ATTAINMENT_WRITE_PERIOD_S = 0.1
#: Least seconds between a worker's re-reads of the attainment file.
ATTAINMENT_READ_PERIOD_S = 0.25
#: Probe requests held in memory at most (older ones are dropped: they would be stale anyway).
MAX_PENDING_PROBES = 4096
_DATAGRAM_BYTES = 4096

_LOCAL: dict[int, SchedulerEndpoint] = {}
_LOCAL_LOCK = threading.Lock()


def bus_dir() -> Path:
    """Where the sockets, the attainment files and (with one API server) the metrics live:
    ``MERIDIAN_BUS_DIR``, else ``meridian-<uid>`` in the temp directory, a folder of this user's
    own rather than the shared temp directory itself."""
    explicit = os.environ.get(BUS_DIR_ENV)
    return Path(explicit) if explicit else Path(tempfile.gettempdir()) / f"meridian-{os.getuid()}"


def private_dir(path: Path) -> Path:
    """``path``, created (mode 0700) where missing, once checked that no other local user can put
    anything into it; raises ``ConfigError`` naming the folder and what is wrong with it."""
    try:
        if not os.path.lexists(path):
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        problem = unsafe_dir_problem(path)
    except OSError as exc:
        raise ConfigError(
            f"cannot create Meridian's folder {str(path)!r} ({exc}); point {BUS_DIR_ENV} at a "
            f"folder this user can write"
        ) from exc
    if problem is not None:
        raise ConfigError(
            f"Meridian's folder {str(path)!r} {problem}, so another local user could plant files "
            f"in it; point {BUS_DIR_ENV} at a folder only this user can write (mode 0700)"
        )
    return path


def unsafe_dir_problem(path: Path) -> str | None:
    """Why another local user could write into ``path`` (a symbolic link, not a directory, owned by
    someone else, writable by group or others), or ``None``."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.getuid():
        return f"belongs to uid {st.st_uid}, not to this process's uid {os.getuid()}"
    if st.st_mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _socket_path(engine_pid: int) -> Path:
    return bus_dir() / f"meridian-{engine_pid}.sock"


def _state_path(engine_pid: int) -> Path:
    return bus_dir() / f"meridian-{engine_pid}.state.json"


class SchedulerEndpoint:
    """The scheduler's end: receives probe requests, publishes attainment."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._pending: deque[tuple[str, int]] = deque(maxlen=MAX_PENDING_PROBES)
        self._stops: deque[tuple[str, str, int]] = deque(maxlen=MAX_PENDING_PROBES)
        self._lock = threading.Lock()
        self._attainment: dict[str, float] = {}
        self._endings: frozenset[str] = frozenset()
        self._published_at = 0.0
        self._dirty = False
        self._sock: socket.socket | None = None
        path = _socket_path(self.pid)
        private_dir(path.parent)
        try:
            path.unlink(missing_ok=True)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind(str(path))
            os.chmod(path, 0o600)
            sock.setblocking(False)
            self._sock = sock
        except OSError as exc:
            # Only workers in other processes need the socket; in-process ones still work.
            logger.warning("meridian: cannot bind %s (%s); EAT probes work only in-process", path, exc)
        with _LOCAL_LOCK:
            _LOCAL[self.pid] = self

    def post_probe(self, parent_req_id: str, num_output_tokens: int) -> None:
        """In-process probe request."""
        with self._lock:
            self._pending.append((parent_req_id, num_output_tokens))

    def post_stop(self, req_id: str, reason: str, num_think_tokens: int) -> None:
        """In-process report that a rule ended ``req_id``'s reasoning."""
        with self._lock:
            self._stops.append((req_id, reason, num_think_tokens))

    def take_stops(self) -> list[tuple[str, str, int]]:
        """Every reasoning stop reported since the last call: ``(req_id, rule, thinking tokens)``."""
        self._drain_socket()
        with self._lock:
            stops = list(self._stops)
            self._stops.clear()
        return stops

    def take_probes(self) -> list[tuple[str, int]]:
        """Every probe request since the last call, oldest first."""
        self._drain_socket()
        with self._lock:
            probes = list(self._pending)
            self._pending.clear()
        return probes

    def _drain_socket(self) -> None:
        if self._sock is None:
            return
        while True:
            try:
                data = self._sock.recv(_DATAGRAM_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            message = _decode(data)
            with self._lock:
                if isinstance(message, _Probe):
                    self._pending.append((message.req_id, message.num_output_tokens))
                elif isinstance(message, _Stop):
                    self._stops.append((message.req_id, message.reason, message.num_think_tokens))

    def publish(self, attainment: dict[str, float], endings: frozenset[str]) -> None:
        """Records each class's recent TTFAT attainment and the requests whose thinking is to end
        now. Other processes see a change at once, or within 0.1 s of activity when changes come
        faster (a deferred write goes out with a later call)."""
        if attainment != self._attainment or endings != self._endings:
            self._attainment = dict(attainment)
            self._endings = endings
            self._dirty = True
        now = time.monotonic()
        if not self._dirty or now - self._published_at < ATTAINMENT_WRITE_PERIOD_S:
            return
        self._published_at = now
        self._dirty = False
        path = _state_path(self.pid)
        try:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            state = json.dumps({"attainment": self._attainment, "end_thinking": sorted(self._endings)})
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(state)
            os.replace(tmp, path)
        except OSError as exc:
            logger.debug("meridian: cannot write %s: %s", path, exc)

    def attainment(self) -> dict[str, float]:
        return self._attainment

    def thinking_endings(self) -> frozenset[str]:
        return self._endings

    def close(self) -> None:
        with _LOCAL_LOCK:
            if _LOCAL.get(self.pid) is self:
                del _LOCAL[self.pid]
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for path in (_socket_path(self.pid), _state_path(self.pid)):
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)


@dataclass(frozen=True)
class _Probe:
    req_id: str
    num_output_tokens: int


@dataclass(frozen=True)
class _Stop:
    req_id: str
    reason: str
    num_think_tokens: int


def _decode(data: bytes) -> _Probe | _Stop | None:
    """A datagram as a message; anything malformed is dropped (``None``)."""
    try:
        message = json.loads(data)
        kind, req_id = message["kind"], message["req_id"]
        if not isinstance(req_id, str):
            return None
        if kind == "probe":
            count = message["num_output_tokens"]
            return _Probe(req_id, count) if _count(count) else None
        if kind == "stop":
            reason, count = message["reason"], message["num_think_tokens"]
            return _Stop(req_id, reason, count) if isinstance(reason, str) and _count(count) else None
    except (ValueError, KeyError, TypeError):
        return None
    return None


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class WorkerEndpoint:
    """The logits processor's end: finds the scheduler lazily (it is built after the workers)."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._attainment: dict[str, float] = {}
        self._endings: frozenset[str] = frozenset()
        self._read_at = 0.0
        self._warned = False
        #: Whether the bus folder is this user's alone; ``None`` until it exists (the scheduler,
        #: built after the workers, creates it).
        self._trusted: bool | None = None

    def _local(self) -> SchedulerEndpoint | None:
        with _LOCAL_LOCK:
            return _LOCAL.get(os.getpid())

    def request_probe(self, parent_req_id: str, num_output_tokens: int) -> None:
        """Asks the scheduler for an EAT probe of ``parent_req_id`` over its first
        ``num_output_tokens`` output tokens."""
        local = self._local()
        if local is not None:
            local.post_probe(parent_req_id, num_output_tokens)
            return
        self._send({"kind": "probe", "req_id": parent_req_id, "num_output_tokens": num_output_tokens})

    def report_stop(self, req_id: str, reason: str, num_think_tokens: int) -> None:
        """Tells the scheduler which rule ended ``req_id``'s reasoning, after how many tokens."""
        local = self._local()
        if local is not None:
            local.post_stop(req_id, reason, num_think_tokens)
            return
        self._send({"kind": "stop", "req_id": req_id, "reason": reason, "num_think_tokens": num_think_tokens})

    def _bus_trusted(self) -> bool:
        """Whether the bus folder is this user's alone: a worker neither sends to a socket nor
        reads a file that another local user could have put there."""
        if self._trusted is None:
            try:
                problem = unsafe_dir_problem(bus_dir())
            except OSError:
                return False
            self._trusted = problem is None
            if problem is not None:
                logger.warning(
                    "meridian: the bus folder %s %s; thinking control runs without the scheduler "
                    "(point %s at a folder only this user can write)",
                    bus_dir(),
                    problem,
                    BUS_DIR_ENV,
                )
        return self._trusted

    def _send(self, message_obj: dict[str, object]) -> None:
        if not self._bus_trusted():
            return
        message = json.dumps(message_obj).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.setblocking(False)
                # vLLM never shuts a logits processor down: the socket goes with the endpoint.
                weakref.finalize(self, self._sock.close)
            self._sock.sendto(message, str(_socket_path(os.getppid())))
        except OSError as exc:
            if not self._warned:
                self._warned = True
                logger.warning(
                    "meridian: no MeridianScheduler reachable (%s): EAT probes and the request log's "
                    "thinking fields need --scheduler-cls meridian.vllm.MeridianScheduler",
                    exc,
                )

    def attainment(self) -> dict[str, float]:
        """Each class's recent TTFAT attainment (empty until the scheduler has published one)."""
        local = self._local()
        if local is not None:
            return local.attainment()
        self._read_state()
        return self._attainment

    def thinking_endings(self) -> frozenset[str]:
        """The requests whose thinking the scheduler ends now (``on_overload: degrade``)."""
        local = self._local()
        if local is not None:
            return local.thinking_endings()
        self._read_state()
        return self._endings

    def _read_state(self) -> None:
        now = time.monotonic()
        if now - self._read_at < ATTAINMENT_READ_PERIOD_S:
            return
        self._read_at = now
        if not self._bus_trusted():
            return
        try:
            loaded = json.loads(_state_path(os.getppid()).read_text())
            attainment, endings = loaded["attainment"], loaded["end_thinking"]
            self._attainment = {str(k): float(v) for k, v in attainment.items()}
            self._endings = frozenset(str(r) for r in endings)
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            pass
