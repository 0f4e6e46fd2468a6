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

pytestmark = pytest.mark.vllm

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


@pytest.fixture
def mooncake_store(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A master on loopback and the client configuration engines read (``MOONCAKE_CONFIG_PATH``);
    the environment the engines run in."""
    import mooncake

    master = Path(mooncake.__file__).resolve().parent / "mooncake_master"
    rpc, http, metrics = free_port(), free_port(), free_port()
    env = dict(os.environ, LD_LIBRARY_PATH=library_path())
    log = tmp_path / "master.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(master), "-rpc_address", "127.0.0.1", "-rpc_port", str(rpc), "-enable_http_metadata_server=true",
             "-http_metadata_server_host", "127.0.0.1", "-http_metadata_server_port", str(http),
             "-metrics_host", "127.0.0.1", "-metrics_port", str(metrics), "-rpc_thread_num", "2"],
            env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_port(rpc, process, log)
        wait_for_port(http, process, log)
        config = tmp_path / "mooncake.json"
        config.write_text(json.dumps({
            "metadata_server": f"http://127.0.0.1:{http}/metadata", "master_server_address": f"127.0.0.1:{rpc}",
            "protocol": "tcp", "device_name": "", "global_segment_size": "256MB", "local_buffer_size": "128MB"}))
        yield dict(env, MOONCAKE_CONFIG_PATH=str(config), VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_HOST_IP="127.0.0.1")
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert process.returncode is not None


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
