"""Type stubs of the Rust extension ``meridian._core`` (hand-written; checked by mypy.stubtest)."""

from typing import Literal, final

__all__ = ["__version__", "Config", "FinishedRequest", "Meridian", "StepPlan", "kernel_source"]
__version__: str

def kernel_source(name: str) -> str:
    """Source of a bundled CUDA kernel file by name."""

@final
class Config:
    """Validated Meridian configuration."""

    @staticmethod
    def from_json(text: str) -> Config:
        """Parses and validates the ``meridian`` block of ``--additional-config``.

        Raises:
            ConfigError: an unknown key or a bad value; the message names the dotted key.
        """
    @property
    def class_names(self) -> list[str]: ...
    @property
    def default_class(self) -> str: ...
    @property
    def tool_call_markers(self) -> list[str]: ...
    @property
    def request_log_path(self) -> str | None: ...
    @property
    def step_log_path(self) -> str | None: ...
    @property
    def policy(self) -> Literal["meridian", "answer_first", "pascal"]: ...
    def class_targets(self, name: str) -> dict[str, float | int | None]: ...

@final
class StepPlan:
    """One engine step's decisions."""

    @property
    def step_id(self) -> int: ...
    @property
    def running_order(self) -> list[int]:
        """Permutation of the ``running`` list passed in; the last entry is the first victim."""
    @property
    def waiting_order(self) -> list[int]: ...
    @property
    def num_admissible(self) -> int: ...
    @property
    def token_budget(self) -> int: ...
    @property
    def num_reserved_blocks(self) -> int: ...
    @property
    def held(self) -> list[int]:
        """Indices into ``running`` that skip this step (paced answers), ascending."""

@final
class FinishedRequest:
    """A finished request's report (latencies in the caller's clock units, ms)."""

    @property
    def req_id(self) -> str: ...
    @property
    def slo_class(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def arrival_ms(self) -> float: ...
    @property
    def ttft_ms(self) -> float | None: ...
    @property
    def ttfat_ms(self) -> float | None: ...
    @property
    def transition_gap_ms(self) -> float | None: ...
    @property
    def think_tpot_ms(self) -> float | None: ...
    @property
    def answer_tpot_ms(self) -> float | None: ...
    @property
    def e2e_ms(self) -> float | None: ...
    @property
    def max_answer_gap_ms(self) -> float: ...
    @property
    def num_stalls(self) -> int: ...
    @property
    def num_think_tokens(self) -> int: ...
    @property
    def num_answer_tokens(self) -> int: ...
    @property
    def num_preemptions_prefill(self) -> int: ...
    @property
    def num_preemptions_think(self) -> int: ...
    @property
    def num_preemptions_answer(self) -> int: ...
    @property
    def met_all(self) -> bool: ...
    @property
    def never_reusable_from_token(self) -> int | None: ...

@final
class Meridian:
    """The policy engine of one vLLM scheduler."""

    def __new__(
        cls,
        config: Config,
        *,
        block_size: int,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        reasoning_start_ids: list[int],
        reasoning_end_ids: list[int],
        tool_call_ids: list[list[int]],
    ) -> Meridian: ...
    @property
    def num_requests(self) -> int: ...
    def add_request(
        self,
        req_id: str,
        arrival_ms: float,
        prompt_token_ids: list[int],
        max_tokens: int,
        slo_class: str | None,
        priority: int,
    ) -> int:
        """Starts tracking a request and returns its handle.

        Raises:
            DuplicateRequestError: the id is already tracked.
            UnknownSloClassError: ``slo_class`` is not configured.
            InvalidArgumentError: ``arrival_ms`` is not a finite, non-negative number.
        """
    def resolve_class(self, req_id: str, slo_class: str | None, priority: int) -> str: ...
    def plan_step(self, now_ms: float, running: list[int], waiting: list[int], num_free_blocks: int) -> StepPlan: ...
    def on_preempted(self, now_ms: float, handle: int) -> tuple[str, bool]: ...
    def on_tokens_batch(self, now_ms: float, handles: list[int], counts: list[int], flat_token_ids: list[int]) -> None: ...
    def on_step_output(
        self, now_ms: float, step_id: int, num_prefill_tokens: int, num_decode_requests: int, num_context_tokens: int
    ) -> None: ...
    def finish(self, now_ms: float, handle: int, reason: str) -> FinishedRequest: ...
    def phase(self, handle: int) -> str: ...
    def num_output_tokens(self, handle: int) -> int: ...
    def handle_of(self, req_id: str) -> int | None: ...
    def stats(self) -> dict[str, int]: ...
    def class_counters(self) -> dict[str, dict[str, int]]: ...
    def step_time_coefficients(self) -> tuple[float, float, float, float]:
        """``(base_ms, per_prefill_token_ms, per_decode_request_ms, per_context_token_ms)``."""
