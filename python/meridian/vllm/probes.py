"""EAT probes: the internal one-token requests that measure a thinking request's answer entropy.

The logits processor asks for a probe (parent ``req_id`` and how many of its output tokens the
probe covers) over the bus; ``ProbeBook`` builds it from the parent the scheduler holds — the
parent's prompt and outputs so far, then the reasoning-end marker, one greedy token — with the
parent's block hasher, LoRA and cache salt, so everything up to the parent's last full block is a
prefix-cache hit, and drops the probes' outputs; the core says which requests are probes and
counts them. Invariant: a probe's outputs never reach a client; they are dropped from every batch
before vLLM's outputs leave the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from meridian.vllm.names import PROBE_FOR_ARG, PROBE_ID_INFIX

if TYPE_CHECKING:
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.request import Request


class ProbeBook:
    """Builds EAT probes and drops their outputs. Which requests are probes is the core's word
    (``Meridian.is_probe`` while live, ``FinishedRequest.probe`` at the finish): the book holds only
    the probes that finished during the step whose outputs it has not dropped yet."""

    def __init__(self, end_ids: list[int]) -> None:
        self._end_ids = end_ids
        #: Probes finished in the step being turned into outputs (vLLM has forgotten them by the
        #: time the outputs are filtered, so the core's report is the only word left).
        self._finished: set[str] = set()
        #: Probes made since start (their ids' sequence numbers).
        self.num_probes = 0

    def build(self, parent: Request, num_output_tokens: int) -> Request:
        """A probe of ``parent`` covering its first ``num_output_tokens`` outputs."""
        from vllm import SamplingParams
        from vllm.v1.request import Request as VllmRequest

        self.num_probes += 1
        outputs = list(parent.output_token_ids[:num_output_tokens])
        params = SamplingParams(max_tokens=1, temperature=0.0, extra_args={PROBE_FOR_ARG: parent.request_id})
        return VllmRequest(
            request_id=f"{parent.request_id}{PROBE_ID_INFIX}{self.num_probes}",
            prompt_token_ids=[*(parent.prompt_token_ids or []), *outputs, *self._end_ids],
            sampling_params=params,
            pooling_params=None,
            client_index=parent.client_index,
            lora_request=parent.lora_request,
            cache_salt=parent.cache_salt,
            block_hasher=parent._block_hasher,
        )

    def finished(self, req_id: str) -> None:
        """A probe the core reported finished: its last output is dropped with this step's."""
        self._finished.add(req_id)

    def drop_outputs(
        self, outputs: dict[int, EngineCoreOutputs], any_live: bool, is_live_probe: Callable[[str], bool]
    ) -> None:
        """Removes every probe's output from ``outputs``: the ones that finished this step and,
        when ``any_live``, the live ones ``is_live_probe`` names."""
        finished, self._finished = self._finished, set()
        if not finished and not any_live:
            return
        for batch in outputs.values():
            batch.outputs = [
                out for out in batch.outputs if out.request_id not in finished and not is_live_probe(out.request_id)
            ]
            if batch.finished_requests and finished:
                batch.finished_requests -= finished
