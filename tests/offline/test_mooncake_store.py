"""The Mooncake store as a KV tier shared by two engines, on loopback: a real ``mooncake_master``
(started here on free 127.0.0.1 ports and stopped after), engine A computes the seeded prompts
and stores their blocks in its segment of the store, engine B — another process, its own KV cache
empty — gets them from A's segment over Mooncake's TCP transfer engine instead of computing them,
and its greedy tokens are A's. Engine B runs ``MeridianScheduler``: Meridian's scheduler keeps
vLLM's connectors working. Then the store behind Meridian's host tier, both parts of vLLM's
``MultiConnector``: engine B gets its prompts from A's segment and, short of KV, its preempted
thinking requests back from the host tier (the core counts the restores), A's tokens still."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.engine_processes]

ENGINE = Path(__file__).resolve().parent / "mooncake_engine.py"
#: Where scripts/setup.sh unpacks libibverbs when the system lacks it.
SYSROOT = Path(sys.prefix) / "sysroot" / "root"


def library_path() -> str:
    dirs = [SYSROOT / "usr" / "lib" / "x86_64-linux-gnu", SYSROOT / "lib" / "x86_64-linux-gnu"]
    return os.pathsep.join([str(d) for d in dirs if d.is_dir()] + [os.environ.get("LD_LIBRARY_PATH", "")])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mooncake_master exited with {process.returncode}:\n{log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"mooncake_master did not listen on 127.0.0.1:{port} within {timeout_s} s")


class Master:
    """A ``mooncake_master`` on free 127.0.0.1 ports that a test can kill and start again on the
    same ports (a restarted master knows nothing of the segments mounted before)."""

    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        import mooncake

        self.binary = Path(mooncake.__file__).resolve().parent / "mooncake_master"
        self.rpc, self.http, self.metrics = free_port(), free_port(), free_port()
        self.env, self.tmp_path = env, tmp_path
        self.process: subprocess.Popen[bytes] | None = None
        self.num_starts = 0

    def start(self) -> None:
        self.num_starts += 1
        log = self.tmp_path / f"master-{self.num_starts}.log"
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [str(self.binary), "-rpc_address", "127.0.0.1", "-rpc_port", str(self.rpc),
                 "-enable_http_metadata_server=true", "-http_metadata_server_host", "127.0.0.1",
                 "-http_metadata_server_port", str(self.http), "-metrics_host", "127.0.0.1",
                 "-metrics_port", str(self.metrics), "-rpc_thread_num", "2"],
                env=self.env, stdout=out, stderr=subprocess.STDOUT)
        wait_for_port(self.rpc, self.process, log)
        wait_for_port(self.http, self.process, log)

    def kill(self) -> None:
        """SIGKILL: no goodbye to the clients."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def client_config(self) -> dict[str, str]:
        return {"metadata_server": f"http://127.0.0.1:{self.http}/metadata",
                "master_server_address": f"127.0.0.1:{self.rpc}", "protocol": "tcp", "device_name": "",
                "global_segment_size": "256MB", "local_buffer_size": "128MB"}


@pytest.fixture
def mooncake_master(tmp_path: Path) -> Iterator[Master]:
    """A master on loopback, started here and stopped after the test."""
    master = Master(tmp_path, dict(os.environ, LD_LIBRARY_PATH=library_path()))
    master.start()
    try:
        yield master
    finally:
        master.stop()
    assert master.process is not None and master.process.returncode is not None


@pytest.fixture
def mooncake_store(mooncake_master: Master, tmp_path: Path) -> dict[str, str]:
    """The client configuration engines read (``MOONCAKE_CONFIG_PATH``) for ``mooncake_master``;
    the environment the engines run in."""
    config = tmp_path / "mooncake.json"
    config.write_text(json.dumps(mooncake_master.client_config()))
    return dict(mooncake_master.env, MOONCAKE_CONFIG_PATH=str(config), VLLM_ENABLE_V1_MULTIPROCESSING="0",
                VLLM_HOST_IP="127.0.0.1")


def run_engines(model: Path, env: dict[str, str], tmp_path: Path, args_a: Sequence[str] = (),
                args_b: Sequence[str] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
    """Engine A stores the seeded prompts and stays up; engine B, another process started beside
    it, runs them once A has finished, while A's segment is in the store. Each engine's JSON
    (``mooncake_engine.py``)."""
    done, out_a, out_b = tmp_path / "done", tmp_path / "a.json", tmp_path / "b.json"
    with (tmp_path / "a.log").open("wb") as log_a, (tmp_path / "b.log").open("wb") as log_b:
        engine_a = subprocess.Popen([sys.executable, str(ENGINE), str(model), str(out_a), "--wait-for", str(done),
                                     *args_a], env=env, stdout=log_a, stderr=subprocess.STDOUT)
        # A's output file is written once its prompts are done (and stored): B reads from A's
        # segment only then; its start-up overlaps A's.
        engine_b = subprocess.Popen([sys.executable, str(ENGINE), str(model), str(out_b), "--start-after", str(out_a),
                                     *args_b], env=env, stdout=log_b, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 600
            while engine_b.poll() is None:
                assert engine_a.poll() is None or out_a.exists(), (tmp_path / "a.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the engines did not finish their prompts"
                time.sleep(0.5)
            assert engine_b.returncode == 0, (tmp_path / "b.log").read_text()[-3000:]
        finally:
            done.touch()
            if engine_b.poll() is None:
                engine_b.kill()
            engine_a.wait(timeout=60)
    return json.loads(out_a.read_text()), json.loads(out_b.read_text())


def test_engine_b_gets_engine_a_s_prefixes_from_the_store(random_model: Path, mooncake_store: dict[str, str],
                                                          tmp_path: Path) -> None:
    a, b = run_engines(random_model, mooncake_store, tmp_path,
                       args_b=["--scheduler-cls", "meridian.vllm.MeridianScheduler"])
    assert a["num_cached_tokens"] == [0, 0, 0]
    # Every full block of each 200-token prompt (6 of 32 tokens) came from A's segment.
    assert b["num_cached_tokens"] == [192, 192, 192], b
    assert b["tokens"] == a["tokens"]


def test_the_host_tier_in_front_of_the_store_restores_preemptions(random_model: Path, mooncake_store: dict[str, str],
                                                                  tmp_path: Path) -> None:
    """vLLM's MultiConnector with Meridian's host tier first and the store second, on engine B:
    its prompts come from A's segment in the store and, under KV pressure (16 usable blocks, vLLM
    keeps one, for three thinking requests of up to 10 blocks each), its preempted requests come
    back from the host tier, the core counting the restores; its greedy tokens are those of A,
    which had room for all."""
    reasoning = ["--reasoning", "--max-tokens", "100"]
    a, b = run_engines(random_model, mooncake_store, tmp_path, args_a=[*reasoning, "--kv-cache-blocks", "64"],
                       args_b=[*reasoning, "--kv-cache-blocks", "17", "--host-tier",
                               "--scheduler-cls", "meridian.vllm.MeridianScheduler",
                               "--meridian", json.dumps({"kv_tier": {"restore": "always"}})])
    assert a["num_cached_tokens"] == [0, 0, 0]
    # The host tier was empty when each prompt first arrived: the store answered, with every full
    # block of the 201-token prompt.
    assert b["num_cached_tokens"] == [192, 192, 192], b
    assert b["kv_tier_installed"], b
    # The core counts through hooks on the host tier part alone: these restores are the host tier's.
    assert b["num_preemptions"] > 0 and b["kv_tier_counters"]["num_restores"] > 0, b
    assert b["tokens"] == a["tokens"]


def wait_for(path: Path, process: subprocess.Popen[bytes], log: Path, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert process.poll() is None, f"exited with {process.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {path.name} within {timeout_s} s"
        time.sleep(0.2)


def test_a_killed_and_restarted_master_costs_hits_not_requests(random_model: Path, mooncake_master: Master,
                                                              mooncake_store: dict[str, str], tmp_path: Path) -> None:
    """Engine A stores the prompts; engine B, started while the master is up, gets them only after
    the master has been SIGKILLed: its lookups and stores fail (Mooncake logs them) and it
    computes everything, A's greedy tokens still. The master is started again, empty, on the same
    ports, and B serves the prompts again with the same tokens and exits cleanly. (With the
    master still dead at exit, Mooncake 0.3's client crashes in its destructor, after every
    request is served: the docs' KV-tiers page says so.)"""
    done, go, again = tmp_path / "done", tmp_path / "go", tmp_path / "again"
    out_a, out_b = tmp_path / "a.json", tmp_path / "b.json"
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    with log_a.open("wb") as la, log_b.open("wb") as lb:
        engine_a = subprocess.Popen([sys.executable, str(ENGINE), str(random_model), str(out_a), "--wait-for", str(done)],
                                    env=mooncake_store, stdout=la, stderr=subprocess.STDOUT)
        engine_b = subprocess.Popen([sys.executable, str(ENGINE), str(random_model), str(out_b), "--start-after", str(go),
                                     "--again-after", str(again), "--scheduler-cls", "meridian.vllm.MeridianScheduler"],
                                    env=mooncake_store, stdout=lb, stderr=subprocess.STDOUT)
        try:
            wait_for(out_a, engine_a, log_a)
            wait_for(out_b.with_suffix(".ready"), engine_b, log_b)
            mooncake_master.kill()
            go.touch()
            wait_for(out_b, engine_b, log_b)
            mooncake_master.start()
            again.touch()
            assert engine_b.wait(timeout=300) == 0, log_b.read_text()[-3000:]
        finally:
            done.touch()
            for engine in (engine_a, engine_b):
                if engine.poll() is None:
                    engine.kill()
                engine.wait(timeout=60)
    a, b, b_again = (json.loads(p.read_text()) for p in (out_a, out_b, out_b.with_suffix(".again.json")))
    assert "Batch RPC call failed" in log_b.read_text() or "Client not available" in log_b.read_text()
    assert b["num_cached_tokens"] == [0, 0, 0], "nothing came from the store with its master dead"
    assert b["tokens"] == a["tokens"]
    assert b_again["tokens"] == a["tokens"]
    assert b["kv_tier_counters"]["num_failed_load_blocks"] == 0, "no hit was offered, so no load failed"
