"""Disaggregated prefill and decode on one machine: a prefill ``vllm serve`` and a decode ``vllm
serve``, both with Meridian (scheduler and middleware), handing the prompt's KV over with vLLM's
``NixlConnector`` (UCX over TCP on 127.0.0.1), behind ``vllm-router`` in its P/D mode.

``Disaggregated`` is a context manager: it starts both servers at once (each with its own NIXL
side-channel port, its own Meridian request and step logs in ``log_dir``), waits for both, then
starts the router, and on exit stops the router and both servers' process groups. ``meridian
disaggregated`` runs one until Ctrl-C or SIGTERM; ``tests/live/test_disaggregated.py`` tests it.
What each side runs and what the router sends each: docs/operations/disaggregated.md.

Invariant: the two servers differ only in their ``kv_role``, their side-channel port, their logs
and, where a caller asks for it (a sabotage test), their model folder or connector options: the
router's P/D mode needs nothing else from them.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from meridian.demo.fleet import VllmRouter
from meridian.demo.server import TINY_BLOCK_SIZE_TOKENS, VllmServer, free_port, tiny_server_args
from meridian.vllm.names import CONFIG_KEY, MIDDLEWARE, SCHEDULER_CLS

#: vLLM's connector for the hand-off (``--kv-transfer-config``'s ``kv_connector``).
NIXL_CONNECTOR = "NixlConnector"
#: ``kv_role`` of each side: the prefill server only sends KV, the decode server only receives.
PREFILL_ROLE = "kv_producer"
DECODE_ROLE = "kv_consumer"
#: The port each side's NIXL agent answers handshakes on (one per server on one machine).
SIDE_CHANNEL_PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
#: UCX over TCP on the loopback device, the side channel and vLLM's own address on 127.0.0.1.
LOOPBACK_ENV = {
    "UCX_TLS": "tcp",
    "UCX_NET_DEVICES": "lo",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
}
#: The router's name for the connector (``--kv-connector``; its default).
ROUTER_KV_CONNECTOR = "nixl"
#: What the two sides are called in logs, file names and the CLI's output.
SIDES = ("prefill", "decode")


def kv_transfer_config(role: str, extra: dict[str, Any] | None = None) -> str:
    """``--kv-transfer-config`` for one side: NIXL with ``role``, plus connector options."""
    config: dict[str, Any] = {"kv_connector": NIXL_CONNECTOR, "kv_role": role}
    if extra:
        config["kv_connector_extra_config"] = extra
    return json.dumps(config)


def request_log(log_dir: Path, side: str) -> Path:
    """Meridian's request log of ``side`` (one JSON line per finished request)."""
    return log_dir / f"requests-{side}.jsonl"


def step_log(log_dir: Path, side: str) -> Path:
    """Meridian's step log of ``side``."""
    return log_dir / f"steps-{side}.jsonl"


@dataclass
class Disaggregated:
    """A prefill and a decode server with Meridian, NIXL between them, the router in front.

    ``server_args``: the ``vllm serve`` flags both sides share after the model (dtype, context,
    cache, reasoning parser, ...; Meridian's scheduler and middleware are added). ``meridian``:
    the ``meridian`` block of ``--additional-config`` for both sides (the logs are set per side).
    ``prefill_model``: another model folder for the prefill side (default: ``model``), and
    ``prefill_extra`` / ``decode_extra``: connector options per side, for tests that sabotage the
    hand-off. ``served_model_name``: the name both serve, so a client names one model."""

    model: Path
    server_args: list[str]
    log_dir: Path
    cache_dir: Path
    meridian: dict[str, Any] = field(default_factory=dict)
    served_model_name: str | None = None
    prefill_model: Path | None = None
    prefill_extra: dict[str, Any] | None = None
    decode_extra: dict[str, Any] | None = None
    router_flags: tuple[str, ...] = ()
    start_timeout_s: float = 600.0
    servers: dict[str, VllmServer] = field(default_factory=dict)
    router: VllmRouter | None = None
    _stack: ExitStack = field(default_factory=ExitStack)

    @property
    def base_url(self) -> str:
        """The router's URL: where clients send their requests."""
        assert self.router is not None, "not started"
        return self.router.base_url

    @property
    def prefill(self) -> VllmServer:
        return self.servers["prefill"]

    @property
    def decode(self) -> VllmServer:
        return self.servers["decode"]

    def server(self, side: str) -> VllmServer:
        """The ``side`` server, not started: its flags, model and NIXL environment."""
        meridian = dict(self.meridian, request_log_path=str(request_log(self.log_dir, side)))
        meridian.setdefault("step_log_path", str(step_log(self.log_dir, side)))
        role, extra = (PREFILL_ROLE, self.prefill_extra) if side == "prefill" else (DECODE_ROLE, self.decode_extra)
        args = [
            *self.server_args,
            "--scheduler-cls",
            SCHEDULER_CLS,
            "--middleware",
            MIDDLEWARE,
            "--kv-transfer-config",
            kv_transfer_config(role, extra),
            "--additional-config",
            json.dumps({CONFIG_KEY: meridian}),
        ]
        if self.served_model_name is not None:
            args += ["--served-model-name", self.served_model_name]
        model = self.prefill_model if side == "prefill" and self.prefill_model is not None else self.model
        env = dict(LOOPBACK_ENV, **{SIDE_CHANNEL_PORT_ENV: str(free_port())})
        return VllmServer(
            model,
            args,
            log_path=self.log_dir / f"serve-{side}.log",
            cache_dir=self.cache_dir,
            start_timeout_s=self.start_timeout_s,
            env=env,
        )

    def start(self) -> Disaggregated:
        """Starts both servers at once, waits for both, then the router; on any failure stops
        what it started and raises (the logs are in ``log_dir``)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for side in SIDES:
                server = self.server(side)
                self._stack.callback(server.stop)
                self.servers[side] = server
                server.launch()
            for side, server in self.servers.items():
                server.wait_healthy(f"{side} vllm serve")
            flags = ("--kv-connector", ROUTER_KV_CONNECTOR, *self.router_flags)
            router = VllmRouter(
                [],
                "round_robin",
                self.log_dir / "router.log",
                flags,
                prefill_decode=(self.prefill.base_url, self.decode.base_url),
            )
            self.router = self._stack.enter_context(router)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stops the router, then both servers (each one's whole process group)."""
        self._stack.close()
        self.router = None

    def __enter__(self) -> Disaggregated:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


#: ``vllm serve`` flags of the tiny reasoning fixture (``tests/fixtures/tiny-reasoner``) that
#: ``meridian disaggregated`` uses when given no flags of its own: the fixture's whole 512-token
#: context, a 2,048-token (64-block) cache, up to 16 requests a batch, and no scheduler flag
#: (``Disaggregated`` adds Meridian's to both sides).
TINY_SERVER_ARGS = tiny_server_args(max_model_len=512, kv_cache_tokens=64 * TINY_BLOCK_SIZE_TOKENS, max_num_seqs=16)


def serve_until_stopped(deployment: Disaggregated, *, poll_s: float = 1.0) -> int:
    """Starts ``deployment``, prints where it listens, and keeps it up until SIGINT or SIGTERM
    (then stops everything and returns 0) or until one of its processes exits (returns 1)."""
    import signal
    import sys
    import time

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        with deployment:
            print(f"router (send requests here): {deployment.base_url}", flush=True)
            for side, server in deployment.servers.items():
                print(f"{side}: {server.base_url}  log {server.log_path}", flush=True)
            print(f"request logs: {', '.join(str(request_log(deployment.log_dir, s)) for s in SIDES)}", flush=True)
            print("Ctrl-C or SIGTERM stops all three", flush=True)
            while True:
                processes = {side: server.process for side, server in deployment.servers.items()}
                processes["router"] = deployment.router.process if deployment.router is not None else None
                for name, process in processes.items():
                    if process is None or process.poll() is not None:
                        code = None if process is None else process.returncode
                        print(f"{name} exited ({code}); stopping the others", file=sys.stderr, flush=True)
                        return 1
                time.sleep(poll_s)
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
