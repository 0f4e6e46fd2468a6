"""Start a real ``vllm serve`` (vLLM's OpenAI-compatible server, through ``meridian.vllm_cli``) on
loopback for tests and demos, and talk to it with streaming clients.

``VllmServer`` is a context manager: it launches the server in its own process group with the
offline environment, waits for ``/health``, and on exit stops the whole group (front end, engine
core, worker); ``launch`` and ``wait_healthy`` split that start for callers that bring several
servers up at once. Its log goes to a file the caller can read. ``stream_chat`` sends one streaming
chat completion and returns what arrived (reasoning text, answer text, finish reason, per-chunk
arrival times).

``tiny_server_args`` is the one description of the ``vllm serve`` flags the tiny reasoning models
run under (the demo's thinking part, ``meridian disaggregated``'s default, the live tests): what
every use shares is fixed there, and what differs between uses (contexts, cache, batch, scheduler)
is a named parameter each caller states.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from meridian.vllm.names import SCHEDULER_CLS

#: Float32 K and V of the tiny fixture (``tests/fixtures/tiny-reasoner``, shape ``tiny``):
#: 2 layers x (K, V) x 2 heads x 32 dims x 4 bytes = 1 KiB a token.
TINY_KV_BYTES_PER_TOKEN = 1024
#: The tiny models' KV block, in tokens; cache sizes below are counted in tokens of it.
TINY_BLOCK_SIZE_TOKENS = 32


def tiny_server_args(
    *,
    max_model_len: int,
    kv_cache_tokens: int,
    max_num_seqs: int,
    scheduler: bool = False,
    kv_bytes_per_token: int = TINY_KV_BYTES_PER_TOKEN,
) -> list[str]:
    """``vllm serve`` flags (after the model) for a tiny reasoning model on vLLM's CPU build.

    Fixed for every use: float32, eager mode, ``TINY_BLOCK_SIZE_TOKENS``-token blocks and
    DeepSeek-R1's reasoning parser (the fixtures think between ``<think>`` and ``</think>``).
    Per use: ``max_model_len`` (the tiny fixture's positions allow 512), a KV cache of
    ``kv_cache_tokens`` at ``kv_bytes_per_token`` (another shape, e.g. the random ``compute``
    model, has another), ``max_num_seqs``, and with ``scheduler`` Meridian's scheduler (off
    where the caller adds its own, or runs stock vLLM)."""
    args = [
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        str(max_model_len),
        "--block-size",
        str(TINY_BLOCK_SIZE_TOKENS),
        "--kv-cache-memory-bytes",
        str(kv_cache_tokens * kv_bytes_per_token),
        "--max-num-seqs",
        str(max_num_seqs),
        "--reasoning-parser",
        "deepseek_r1",
    ]
    return args + ["--scheduler-cls", SCHEDULER_CLS] if scheduler else args


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(base_url: str, process: subprocess.Popen[bytes], timeout_s: float, what: str, log_path: Path) -> None:
    """Returns once ``GET base_url/health`` answers 200; raises ``RuntimeError`` if ``process``
    exits first, ``TimeoutError`` after ``timeout_s`` (both naming ``what`` and its log)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}; log: {log_path}")
        try:
            if httpx.get(f"{base_url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{what} did not become healthy in {timeout_s:.0f} s; log: {log_path}")


class VllmServer:
    """``vllm serve MODEL ARGS...`` on 127.0.0.1, for the duration of a ``with`` block."""

    def __init__(
        self,
        model: Path,
        args: list[str],
        *,
        log_path: Path,
        cache_dir: Path,
        start_timeout_s: float = 300.0,
        env: dict[str, str] | None = None,
    ):
        self.model = model
        #: Variables this server's processes get on top of the caller's and the offline ones.
        self.env = dict(env or {})
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.args = args
        self.log_path = log_path
        self.cache_dir = cache_dir
        self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "meridian.vllm_cli",
            "serve",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.args,
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        cache = self.cache_dir
        env.update(
            {
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "OMP_NUM_THREADS": "1",
                "VLLM_CACHE_ROOT": str(cache / "vllm"),
                "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
                "VLLM_RPC_BASE_PATH": str(cache / "rpc"),
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.env)
        (cache / "rpc").mkdir(parents=True, exist_ok=True)
        return env

    def start(self) -> VllmServer:
        """Starts the server; returns once ``/health`` answers, raises if the process dies first."""
        self.launch()
        try:
            self.wait_healthy()
        except TimeoutError:
            self.stop()
            raise
        return self

    def launch(self) -> subprocess.Popen[bytes]:
        """Starts the server's process group and returns at once, not waiting for ``/health``:
        for callers that start several servers side by side (``wait_healthy`` then waits for
        each). ``stop`` ends it, whether or not it became healthy."""
        if self.process is not None:
            # A second group would be left running: ``stop`` only knows the latest.
            raise RuntimeError(f"vllm serve on port {self.port} is already launched")
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            self.command(), stdout=self._log, stderr=subprocess.STDOUT, env=self.environment(), start_new_session=True
        )
        return self.process

    def wait_healthy(self, what: str = "vllm serve") -> None:
        """Returns once the launched server's ``/health`` answers; raises ``RuntimeError`` if its
        process exits first, ``TimeoutError`` after ``start_timeout_s`` (``what`` names it in
        either). Leaves the server running on failure: stopping it is the caller's."""
        if self.process is None:
            raise RuntimeError(f"{what} was not launched")
        wait_healthy(self.base_url, self.process, self.start_timeout_s, what, self.log_path)

    def wait_for_exit(self, timeout_s: float) -> int:
        """Runs the server expecting it to exit by itself (a start-up failure); returns its code."""
        process = self.launch()
        try:
            return process.wait(timeout=timeout_s)
        finally:
            self.stop()

    def stop(self) -> None:
        """Stops the server's whole process group, then closes its log."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


@dataclass
class StreamResult:
    """What one streaming chat completion delivered."""

    status: int
    sent_s: float = 0.0
    reasoning: str = ""
    content: str = ""
    finish_reason: str | None = None
    error: str | None = None
    #: Arrival times (time.monotonic) of chunks carrying reasoning text, and of chunks carrying answer text.
    reasoning_times_s: list[float] = field(default_factory=list)
    content_times_s: list[float] = field(default_factory=list)


def stream_chat(
    base_url: str,
    model: str,
    message: str,
    *,
    max_tokens: int = 400,
    extra: dict[str, Any] | None = None,
    timeout_s: float = 300.0,
    headers: dict[str, str] | None = None,
) -> StreamResult:
    """One streaming ``/v1/chat/completions`` request at temperature 0 (``headers``: e.g. vLLM's
    ``X-data-parallel-rank``)."""
    import httpx

    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": message}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
    }
    body.update(extra or {})
    sent_s = time.monotonic()
    with (
        httpx.Client(timeout=timeout_s) as client,
        client.stream("POST", f"{base_url}/v1/chat/completions", json=body, headers=headers) as r,
    ):
        result = StreamResult(status=r.status_code, sent_s=sent_s)
        if r.status_code != 200:
            result.error = r.read().decode(errors="replace")
            return result
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            payload = json.loads(line[len("data: ") :])
            if "error" in payload:
                result.error = json.dumps(payload["error"])
                continue
            for choice in payload.get("choices", []):
                delta = choice.get("delta") or {}
                reasoning = delta.get("reasoning") or delta.get("reasoning_content") or ""
                content = delta.get("content") or ""
                now = time.monotonic()
                if reasoning:
                    result.reasoning_times_s.append(now)
                    result.reasoning += reasoning
                if content:
                    result.content_times_s.append(now)
                    result.content += content
                if choice.get("finish_reason"):
                    result.finish_reason = choice["finish_reason"]
        return result
