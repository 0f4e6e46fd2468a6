"""EAT probes: the internal one-token requests that measure a thinking request's answer entropy.

The logits processor asks for a probe (parent ``req_id`` and how many of its output tokens the
probe covers) over the bus; ``ProbeBook`` builds it from the parent the scheduler holds — the
parent's prompt and outputs so far, then the reasoning-end marker, one greedy token — with the
parent's block hasher, LoRA and cache salt, so everything up to the parent's last full block is a
prefix-cache hit, and keeps the books: which requests in flight are probes, how many were made,
how many of their prompt tokens came from the prefix cache. Invariant: a probe's outputs never
reach a client; they are dropped from every batch before vLLM's outputs leave the scheduler.
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING, Any

from meridian.vllm.names import PROBE_FOR_ARG, PROBE_ID_INFIX

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.request import Request


class ProbeBook:
    """Builds EAT probes and tracks the ones in flight."""

    def __init__(self, end_ids: list[int]) -> None:
        self._end_ids = end_ids
        self._in_flight: set[str] = set()
        #: Probes made since start.
        self.num_probes = 0
        #: Probe prompt tokens served from the prefix cache (the rest is the probes' cost).
        self.num_cached_tokens = 0

    def is_probe(self, req_id: str) -> bool:
        return req_id in self._in_flight

    def build(self, parent: Request, num_output_tokens: int) -> Request:
        """A probe of ``parent`` covering its first ``num_output_tokens`` outputs, now in flight."""
        from vllm import SamplingParams
        from vllm.v1.request import Request as VllmRequest

        self.num_probes += 1
        outputs = list(parent.output_token_ids[:num_output_tokens])
        params = SamplingParams(max_tokens=1, temperature=0.0, extra_args={PROBE_FOR_ARG: parent.request_id})
        probe = VllmRequest(
            request_id=f"{parent.request_id}{PROBE_ID_INFIX}{self.num_probes}",
            prompt_token_ids=[*(parent.prompt_token_ids or []), *outputs, *self._end_ids],
            sampling_params=params,
            pooling_params=None,
            client_index=parent.client_index,
            lora_request=parent.lora_request,
            cache_salt=parent.cache_salt,
            block_hasher=parent._block_hasher,
        )
        self._in_flight.add(probe.request_id)
        return probe

    def count_cached(self, output: SchedulerOutput) -> None:
        """Adds the prefix-cache hits of the probes this step admitted."""
        if self._in_flight:
            self.num_cached_tokens += sum(
                new.num_computed_tokens for new in output.scheduled_new_reqs if new.req_id in self._in_flight
            )

    def drop_outputs(self, outputs: dict[int, EngineCoreOutputs], live_req_ids: Container[str]) -> None:
        """Removes every probe's output from ``outputs``; forgets probes that are done."""
        if not self._in_flight:
            return
        done: set[str] = set()
        for batch in outputs.values():
            kept: list[Any] = []
            for out in batch.outputs:
                if out.request_id in self._in_flight:
                    if out.finish_reason is not None:
                        done.add(out.request_id)
                else:
                    kept.append(out)
            batch.outputs = kept
            if batch.finished_requests:
                batch.finished_requests -= self._in_flight
        self._in_flight -= {req_id for req_id in done if req_id not in live_req_ids}
