"""Typed configuration and results of the single-process engine.

from distributed_spec.engine.config import EngineConfig, GenerationResult, RunStats
"""

from __future__ import annotations

from dataclasses import dataclass, field

from distributed_spec.engine.draft_length import GAMMA_SCHEDULES
from distributed_spec.engine.proposers import PROPOSERS
from distributed_spec.verify import VERIFY_METHODS, SamplingParams

# "autoregressive" runs the target alone through the same loop: the baseline.
ENGINE_METHODS = (*VERIFY_METHODS, "autoregressive")
FINISH_REASONS = ("eos", "stop", "length")


@dataclass
class EngineConfig:
    """How the engine decodes; every field is validated on construction."""

    # Verifier: "block", "token", "greedy", or "autoregressive" (target only, no draft).
    method: str = "block"
    # Draft block length g: tokens the draft proposes per iteration (ignored by "autoregressive");
    # the starting g of every row under the "adaptive" schedule.
    gamma: int = 4
    # "constant" (g = gamma throughout), "adaptive" (per row: +2 after a fully kept block, -1
    # otherwise, within [1, max_gamma]; see draft_length.py) or "goodput" (each step the g in
    # {0, ..., max_gamma} with the most expected tokens per second, 0 = no draft; see goodput.py).
    gamma_schedule: str = "constant"
    # The largest g the "adaptive" and "goodput" schedules use.
    max_gamma: int = 8
    # A row's block ends after the first draft token whose draft probability is below this (0: off).
    draft_confidence_threshold: float = 0.0
    # What proposes the blocks (proposers.py): "model" (the draft model), "ngram" (prompt lookup in
    # the row's own tokens, no draft model) or "model+ngram" (n-gram where it matches, else the model).
    proposer: str = "model"
    # The n-gram proposer matches the row's last n tokens, n from ngram_max down to ngram_min.
    ngram_min: int = 1
    ngram_max: int = 3
    # Warping applied to draft and target logits alike (temperature 0 = greedy).
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # Tokens to generate per prompt at most (finish_reason "length" when reached).
    max_new_tokens: int = 64
    # Rows decoded together at most.
    max_batch_size: int = 8
    # True: a finished row's place goes to the next prompt at the next step (continuous batching);
    # False: static batches (the next batch starts when the last row of the current one ends).
    continuous_batching: bool = True
    # Prompt tokens a row feeds the target per step at most (a long prompt goes in by chunks beside
    # the other rows' blocks instead of stalling them); None: the whole prompt at once.
    prefill_chunk_tokens: int | None = 256
    # Seed of the torch.Generator that draws every uniform of a run.
    seed: int = 0
    # Token ids that end a sequence (kept as its last token; finish_reason "eos").
    eos_token_ids: tuple[int, ...] = ()
    # Strings that end a sequence once its decoded text contains one (needs a tokenizer).
    stop_strings: tuple[str, ...] = ()
    # A runner compacts its KV cache once padding and rejected slots exceed this fraction of it.
    compact_fraction: float = 0.5

    def __post_init__(self) -> None:
        if isinstance(self.sampling, dict):
            # From YAML/JSON (e.g. a Hydra config group): {"temperature": ..., "top_k": ..., "top_p": ...}.
            self.sampling = SamplingParams(**self.sampling)
        if self.method not in ENGINE_METHODS:
            raise ValueError(f"engine.method must be one of {ENGINE_METHODS}, got {self.method!r}")
        if self.method != "autoregressive" and self.gamma < 1:
            raise ValueError(f"engine.gamma (draft block length) must be >= 1, got {self.gamma}")
        if self.gamma_schedule not in GAMMA_SCHEDULES:
            raise ValueError(
                f"engine.gamma_schedule must be one of {GAMMA_SCHEDULES}, got {self.gamma_schedule!r}"
            )
        if self.gamma_schedule == "goodput" and self.max_gamma < 1:
            raise ValueError(f"engine.max_gamma must be >= 1 for the goodput schedule, got {self.max_gamma}")
        if self.gamma_schedule == "adaptive" and self.max_gamma < self.gamma:
            raise ValueError(
                f"engine.max_gamma ({self.max_gamma}) must be >= engine.gamma ({self.gamma}), the adaptive "
                "schedule's starting block length"
            )
        if not 0.0 <= self.draft_confidence_threshold < 1.0:
            raise ValueError(
                f"engine.draft_confidence_threshold must be in [0, 1) (0 disables it), "
                f"got {self.draft_confidence_threshold}"
            )
        if self.proposer not in PROPOSERS:
            raise ValueError(f"engine.proposer must be one of {PROPOSERS}, got {self.proposer!r}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(
                f"engine.ngram_min and engine.ngram_max need 1 <= ngram_min <= ngram_max, "
                f"got {self.ngram_min} and {self.ngram_max}"
            )
        if self.max_new_tokens < 1:
            raise ValueError(f"engine.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.max_batch_size < 1:
            raise ValueError(f"engine.max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.prefill_chunk_tokens is not None and self.prefill_chunk_tokens < 1:
            raise ValueError(f"engine.prefill_chunk_tokens must be >= 1 or null, got {self.prefill_chunk_tokens}")
        if not 0.0 < self.compact_fraction <= 1.0:
            raise ValueError(f"engine.compact_fraction must be in (0, 1], got {self.compact_fraction}")
        self.eos_token_ids = tuple(int(token_id) for token_id in self.eos_token_ids)
        self.stop_strings = tuple(self.stop_strings)
        if any(not stop for stop in self.stop_strings):
            raise ValueError("engine.stop_strings must not contain an empty string")

    @property
    def uses_draft(self) -> bool:
        """Whether steps propose blocks at all (by the draft model or by n-grams)."""
        return self.method != "autoregressive"

    @property
    def uses_draft_model(self) -> bool:
        """Whether a draft model must be loaded and run."""
        return self.uses_draft and self.proposer != "ngram"

    @property
    def uses_ngram(self) -> bool:
        return self.uses_draft and self.proposer != "model"

    @property
    def gamma_limit(self) -> int:
        """The longest block any iteration drafts (0 without a draft)."""
        if not self.uses_draft:
            return 0
        return self.gamma if self.gamma_schedule == "constant" else self.max_gamma


@dataclass
class RowStats:
    """What one prompt cost."""

    # Tokens generated for this prompt (the output length).
    num_tokens: int = 0
    # Decoding iterations this row took part in = target calls it needed (the first also read the prompt).
    num_iterations: int = 0
    # Draft tokens accepted over all iterations.
    num_accepted: int = 0

    @property
    def block_efficiency(self) -> float:
        """Tokens per target call, counting the correction/bonus token; in [1, g+1]."""
        return self.num_tokens / max(self.num_iterations, 1)


@dataclass
class RunStats:
    """What a run (one or more batches) cost; `merge` adds two runs."""

    gamma: int = 0
    # Batched forward passes (each serves every active row at once); there is no separate prefill:
    # each batch's first draft and target forwards also process its prompts.
    num_target_calls: int = 0
    num_draft_calls: int = 0
    # Tokens generated over all rows.
    num_tokens: int = 0
    # Sum over target calls of the rows they served: the denominator of block efficiency.
    num_row_iterations: int = 0
    # [g] per draft position i: rows that verified a draft token at i / rows that kept it.
    num_proposed_per_position: list[int] = field(default_factory=list)
    num_accepted_per_position: list[int] = field(default_factory=list)
    # [g_limit + 1] steps that drafted g tokens per row, g = 0 (no draft) .. g_limit.
    num_steps_per_draft_len: list[int] = field(default_factory=list)
    # Additive counters: the runtime's own (the Ray runtime's transfer time, wire bytes, restarts) and
    # the proposers' ("proposer/rows_ngram", "proposer/accepted_model", ...: decoding rows whose
    # block came from each proposer, or none; drafts verified and kept; steps the draft model ran).
    extra: dict[str, float] = field(default_factory=dict)
    # Wall-clock seconds: draft proposals, target scoring (prompts included), verification, and
    # everything else (cache rollback/compaction, bookkeeping, stop checks).
    draft_s: float = 0.0
    target_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    total_s: float = 0.0

    @property
    def block_efficiency(self) -> float:
        """Tokens per target call per row, counting the correction/bonus token (docs/design.md section 2)."""
        return self.num_tokens / max(self.num_row_iterations, 1)

    @property
    def mean_accepted_length(self) -> float:
        return sum(self.num_accepted_per_position) / max(self.num_row_iterations, 1)

    @property
    def acceptance_per_position(self) -> list[float]:
        """[g] fraction of the iterations verifying draft position i in which it was kept."""
        return [
            accepted / proposed if proposed else 0.0
            for accepted, proposed in zip(self.num_accepted_per_position, self.num_proposed_per_position)
        ]

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.total_s if self.total_s > 0 else 0.0

    def merge(self, other: RunStats) -> RunStats:
        gamma = max(self.gamma, other.gamma)

        def padded(counts: list[int]) -> list[int]:
            return counts + [0] * (gamma - len(counts))

        steps_a, steps_b = self.num_steps_per_draft_len, other.num_steps_per_draft_len
        width = max(len(steps_a), len(steps_b))
        extra = dict(self.extra)
        for name, value in other.extra.items():
            extra[name] = extra.get(name, 0.0) + value
        return RunStats(
            gamma=gamma,
            num_steps_per_draft_len=[
                a + b for a, b in zip(steps_a + [0] * (width - len(steps_a)), steps_b + [0] * (width - len(steps_b)))
            ],
            extra=extra,
            num_target_calls=self.num_target_calls + other.num_target_calls,
            num_draft_calls=self.num_draft_calls + other.num_draft_calls,
            num_tokens=self.num_tokens + other.num_tokens,
            num_row_iterations=self.num_row_iterations + other.num_row_iterations,
            num_proposed_per_position=[
                a + b
                for a, b in zip(
                    padded(self.num_proposed_per_position), padded(other.num_proposed_per_position)
                )
            ],
            num_accepted_per_position=[
                a + b
                for a, b in zip(
                    padded(self.num_accepted_per_position), padded(other.num_accepted_per_position)
                )
            ],
            draft_s=self.draft_s + other.draft_s,
            target_s=self.target_s + other.target_s,
            verify_s=self.verify_s + other.verify_s,
            other_s=self.other_s + other.other_s,
            total_s=self.total_s + other.total_s,
        )

    def as_dict(self) -> dict[str, float | int | list[float]]:
        """Flat metrics for logging (W&B, console, JSON)."""
        return {
            "num_target_calls": self.num_target_calls,
            "num_draft_calls": self.num_draft_calls,
            "num_tokens": self.num_tokens,
            "block_efficiency": self.block_efficiency,
            "mean_accepted_length": self.mean_accepted_length,
            "acceptance_per_position": self.acceptance_per_position,
            "steps_per_draft_len": list(self.num_steps_per_draft_len),
            "tokens_per_s": self.tokens_per_s,
            "draft_s": self.draft_s,
            "target_s": self.target_s,
            "verify_s": self.verify_s,
            "other_s": self.other_s,
            "total_s": self.total_s,
        }


@dataclass
class GenerationResult:
    """The output for one prompt."""

    # Generated ids only (no prompt); ends with the EOS id when finish_reason == "eos", never
    # holds a token past EOS, a stop string or max_new_tokens.
    token_ids: list[int]
    # "eos", "stop" or "length".
    finish_reason: str
    stats: RowStats
