"""Disaggregated prefill and decode, live: a prefill and a decode ``vllm serve`` with Meridian,
vLLM's NixlConnector between them (UCX over TCP on 127.0.0.1), ``vllm-router`` in P/D mode in
front (``meridian.demo.disaggregated``, what ``meridian disaggregated`` runs).

The model is the seeded random-weights one (``random_model``): its every output token depends
on its whole KV cache, so KV that did not arrive, or arrived from another prompt, changes its
greedy output (the trained fixture counts down from its last token and would not notice). The
prompts stay under one 32-token block, so neither server's prefix cache holds them (only full
blocks are cached): every answer below is computed from KV that was computed or received for it.

One deployment for the module; the last two tests are destructive (a vanished prefill agent is
simulated, then the decode server is killed mid-stream) and run last. On 2 cores this is a
function check: each side's NIXL agent polls without pause (nixl 1.5.1), and a hand-off of a
few KiB takes seconds here.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tiny_server import QUEUE_LATE

from meridian._core import parse_shed_notice
from meridian.demo.disaggregated import Disaggregated, request_log
from meridian.demo.server import TINY_BLOCK_SIZE_TOKENS, tiny_server_args
from meridian.vllm.names import CLASS_ARG, METRIC_NAMES

pytestmark = pytest.mark.vllm

MODEL_NAME = "m"
#: The random model's shape (``MODEL_SHAPES["compute"]``): 4 layers x (K, V) x 4 heads x 64 x 4 B.
KV_BYTES_PER_TOKEN = 8192
#: No scheduler flag: ``Disaggregated`` adds Meridian's to both sides.
SERVER_ARGS = tiny_server_args(max_model_len=256, kv_cache_tokens=64 * TINY_BLOCK_SIZE_TOKENS, max_num_seqs=4,
                               kv_bytes_per_token=KV_BYTES_PER_TOKEN)
#: A class other than the default (``interactive``): seen on both sides only if it crossed both.
CLASS = "batch"
#: Prompts of 12 words, one token each (the fixture's tokenizer is word-level): under one block.
PROMPTS = [
    "think 7 answer 2 count down so ok the next step is done",
    "think 9 answer 4 count down so ok the next step is done",
]
NUM_TOKENS = 4
#: Bound on any one request here: slow (seconds per hand-off on a loaded 2-core box), never a hang.
TIMEOUT_S = 180.0


#: The default classes, queueing when late, and `rush`, whose 1 ms TTFT target no prompt can
#: meet: the prefill side sheds every `rush` request before computing it.
CLASSES = {
    "classes": {
        "interactive": {"ttft_ms": 1000, "ttfat_ms": 15000, "answer_tpot_ms": 50, "rank": 0, "on_overload": "queue"},
        "standard": {"ttft_ms": 3000, "ttfat_ms": 60000, "answer_tpot_ms": 100, "rank": 1, "on_overload": "queue"},
        "batch": {"ttft_ms": 60000, "ttfat_ms": 1800000, "answer_tpot_ms": 1000, "rank": 2, "on_overload": "queue"},
        "rush": {"ttft_ms": 1, "ttfat_ms": 60000, "answer_tpot_ms": 1000, "rank": 0, "on_overload": "shed"},
    },
    "default_class": "standard",
    "priority_map": {"0": "standard"},
}


@pytest.fixture(scope="module")
def pd(random_model: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Disaggregated]:
    folder = tmp_path_factory.mktemp("disaggregated")
    with Disaggregated(random_model, SERVER_ARGS, folder, cache_dir, meridian=dict(QUEUE_LATE) | CLASSES,
                       served_model_name=MODEL_NAME) as deployment:
        yield deployment


def complete(url: str, prompt: str, *, max_tokens: int = NUM_TOKENS, **extra: Any) -> httpx.Response:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "vllm_xargs": {CLASS_ARG: CLASS}, **extra}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=TIMEOUT_S)


def text_of(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["text"])


def source_tokens(server_url: str) -> dict[str, float]:
    """The server's prompt tokens by where their KV came from (vLLM's own counter), once two
    reads a second apart agree (the engine's stats reach the API server after its outputs)."""
    def read() -> dict[str, float]:
        sums: dict[str, float] = {}
        text = httpx.get(f"{server_url}/metrics", timeout=10.0).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "vllm:prompt_tokens_by_source_total":
                    source = sample.labels["source"]
                    sums[source] = sums.get(source, 0.0) + sample.value
        return {"external": sums.get("external_kv_transfer", 0.0), "local": sums.get("local_compute", 0.0)}

    last, deadline = read(), time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = read()
        if now == last:
            break
        last = now
    return last


def handoffs(server_url: str, outcome: str, *, at_least: float = 1.0) -> float:
    """Meridian's ``meridian:kv_handoffs_total`` of ``outcome`` on a server, once it reaches
    ``at_least`` or after 10 s (the counters are mirrored at most every 0.25 s and when idle)."""
    deadline = time.monotonic() + 10
    while True:
        text = httpx.get(f"{server_url}/metrics", timeout=10.0).text
        total = sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                    if sample.name == METRIC_NAMES["kv_handoffs"] and sample.labels.get("outcome") == outcome)
        if total >= at_least or time.monotonic() > deadline:
            return total
        time.sleep(0.5)


def log_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a request log, each parsed: a torn line fails the test."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def lines_for(path: Path, response_id: str, *, wait_s: float = 30.0) -> list[dict[str, Any]]:
    """The request log's lines of the request the router answered as ``response_id`` (the router's
    request id is in both sides' ids); waits for them (a line is written when the request ends)."""
    key = response_id.split("-", 1)[1]
    deadline = time.monotonic() + wait_s
    while True:
        found = [line for line in log_lines(path) if key in line["req_id"]]
        if found or time.monotonic() > deadline:
            return found


def test_routed_outputs_match_a_colocated_server_and_the_kv_arrives(pd: Disaggregated) -> None:
    before = source_tokens(pd.decode.base_url)
    routed = [complete(pd.base_url, p) for p in PROMPTS[:1]]
    after = source_tokens(pd.decode.base_url)
    # The reference: the same prompts computed whole on one server with the same flags (the prefill
    # server asked directly, no hand-off).
    colocated = [text_of(complete(pd.prefill.base_url, p)) for p in PROMPTS[:1]]
    assert [text_of(r) for r in routed] == colocated
    prompt_tokens = sum(r.json()["usage"]["prompt_tokens"] for r in routed)
    received = after["external"] - before["external"]
    computed = after["local"] - before["local"]
    print(f"\ndecode side: {received:.0f} prompt tokens received, {computed:.0f} computed, of {prompt_tokens}")
    # The decode side computes at most the last prompt token of each itself (vLLM leaves one to
    # sample from); the rest arrived.
    assert received >= prompt_tokens - len(routed) and computed <= len(routed), (received, computed)
    # The class crossed the router to both sides, each of which wrote the request whole, and each
    # side's Meridian knew its part: the prefill side's sent its KV on, the decode side's received it.
    for response in routed:
        for side, part in (("prefill", "sends"), ("decode", "receives")):
            lines = lines_for(request_log(pd.log_dir, side), response.json()["id"])
            assert [(line["slo_class"], line["kv_handoff"]) for line in lines] == [(CLASS, part)], (side, lines)
        [prefill_line] = lines_for(request_log(pd.log_dir, "prefill"), response.json()["id"])
        assert prefill_line["num_think_tokens"] + prefill_line["num_answer_tokens"] == 1, prefill_line
    assert handoffs(pd.prefill.base_url, "sent") >= len(routed)
    assert handoffs(pd.decode.base_url, "received") >= len(routed)


def test_a_sabotaged_handoff_changes_the_output(pd: Disaggregated) -> None:
    """The decode side is handed the KV of another prompt of the same length and the same last
    token: had it computed the prompt itself, its answer would be the prompt's colocated one; it
    answers the donor's, whose KV it read (it computes only the last token itself)."""
    donor, prompt = PROMPTS[0] + " wait", PROMPTS[1] + " wait"
    prefilled = complete(pd.prefill.base_url, donor, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    assert prefilled.status_code == 200, prefilled.text
    params = prefilled.json()["kv_transfer_params"]
    assert params and params["do_remote_prefill"], params
    sabotaged = text_of(complete(pd.decode.base_url, prompt, kv_transfer_params=params))
    colocated = text_of(complete(pd.prefill.base_url, prompt))
    donor_colocated = text_of(complete(pd.prefill.base_url, donor))
    print(f"\nsabotaged {sabotaged!r}, colocated {colocated!r}, donor's {donor_colocated!r}")
    assert sabotaged != colocated and sabotaged == donor_colocated


def test_a_bad_argument_is_refused_through_the_router(pd: Disaggregated) -> None:
    response = httpx.post(f"{pd.base_url}/v1/completions", timeout=TIMEOUT_S,
                          json={"model": MODEL_NAME, "prompt": PROMPTS[0], "max_tokens": 2,
                                "vllm_xargs": {CLASS_ARG: "no-such-class"}})
    assert response.status_code == 400 and CLASS_ARG in response.text, response.text


def test_a_shed_on_the_prefill_side_reaches_the_client_with_retry_after(pd: Disaggregated) -> None:
    """A request its class's TTFT target rules out is shed by the prefill side before its prompt
    is computed or its KV sent; through the router the client gets the shed status and Meridian's
    notice with the seconds to wait, and the decode side never sees it. (vllm-router 0.1.17's P/D
    mode drops the prefill side's ``Retry-After`` header; the notice in the body still says it.)"""
    response = complete(pd.base_url, PROMPTS[0], vllm_xargs={CLASS_ARG: "rush"})
    print(f"\nshed through the router: HTTP {response.status_code}, Retry-After "
          f"{response.headers.get('retry-after')}: {response.text[:160]}")
    assert response.status_code == 429, response.text
    notice = parse_shed_notice(response.json()["error"]["message"])
    assert notice is not None and notice[0] == "ttft" and notice[1] >= 1, response.text
    if "retry-after" in response.headers:
        assert int(response.headers["retry-after"]) == notice[1]
    assert not [line for line in log_lines(request_log(pd.log_dir, "decode")) if line["slo_class"] == "rush"]


def test_a_vanished_prefill_agent_ends_in_a_clear_error(pd: Disaggregated) -> None:
    """The decode side is told to read KV from a NIXL agent that is not there (a port nothing
    listens on): the request fails at once with an error, the server stays up, its log whole."""
    gone = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[1]],
            "remote_engine_id": "gone", "remote_request_id": "gone", "remote_host": "127.0.0.1",
            "remote_port": 1, "tp_size": 1, "remote_num_tokens": len(PROMPTS[0].split())}
    started = time.monotonic()
    response = complete(pd.decode.base_url, PROMPTS[0], kv_transfer_params=gone)
    elapsed = time.monotonic() - started
    print(f"\nvanished agent: HTTP {response.status_code} after {elapsed:.1f} s: {response.text[:200]}")
    assert response.status_code >= 500 and elapsed < TIMEOUT_S, response.text
    assert httpx.get(f"{pd.decode.base_url}/health", timeout=10).status_code == 200
    assert any(line["reason"] == "error" for line in log_lines(request_log(pd.log_dir, "decode")))
    assert handoffs(pd.decode.base_url, "failed") >= 1, "the decode side's Meridian counted the failed arrival"


def test_the_decode_side_killed_mid_stream_ends_the_stream(pd: Disaggregated) -> None:
    """The decode server dies after its first tokens: the client's stream ends (an error or a cut
    stream, never a normal finish) within the bound, a new request gets an error status, and the
    prefill side, which finished its part, keeps its request log whole with the request in it."""
    body = {"model": MODEL_NAME, "prompt": PROMPTS[0], "max_tokens": 200, "ignore_eos": True,
            "temperature": 0.0, "stream": True, "vllm_xargs": {CLASS_ARG: CLASS}}
    response_id, finish, chunks, error = None, None, 0, None
    started = time.monotonic()
    try:
        with httpx.Client(timeout=httpx.Timeout(TIMEOUT_S, read=60.0)) as client, \
                client.stream("POST", f"{pd.base_url}/v1/completions", json=body) as stream:
            assert stream.status_code == 200
            for line in stream.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                payload = json.loads(line[len("data: "):])
                if "error" in payload:
                    error = payload["error"]
                    continue
                response_id = response_id or payload["id"]
                chunks += 1
                finish = payload["choices"][0].get("finish_reason") or finish
                if chunks == 3:
                    assert pd.decode.process is not None
                    os.killpg(pd.decode.process.pid, signal.SIGKILL)
    except httpx.HTTPError as exc:  # the router cut the connection: a clear end too
        error = repr(exc)
    elapsed = time.monotonic() - started
    print(f"\nkilled mid-stream: {chunks} chunks, finish {finish!r}, error {error!r}, {elapsed:.1f} s")
    assert finish is None, "a stream cut short must not end as a normal finish"
    assert chunks >= 3 and response_id is not None
    after = httpx.post(f"{pd.base_url}/v1/completions", timeout=TIMEOUT_S,
                       json={"model": MODEL_NAME, "prompt": PROMPTS[1], "max_tokens": 2})
    print(f"next request: HTTP {after.status_code} {after.text[:200]}")
    assert after.status_code >= 500
    [prefill_line] = lines_for(request_log(pd.log_dir, "prefill"), response_id)
    assert prefill_line["slo_class"] == CLASS
    log_lines(request_log(pd.log_dir, "decode"))  # every line the killed side wrote is whole
