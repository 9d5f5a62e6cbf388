"""The engine's configuration (the verifier, sampling and engine groups of conf/) and its results.

    from distributed_spec.engine.config import EngineConfig, SamplingConfig, VerifierConfig
    config = EngineConfig(VerifierConfig(method="block", num_draft_tokens=4), SamplingConfig(temperature=0))

One class per Hydra group (torchtitan's shape): `VerifierConfig` is conf/verifier, `SamplingConfig`
conf/sampling, `SchedulingConfig` conf/engine; the job (distributed_spec.config.JobConfig) holds the
same objects and hands them to the engine unchanged. Each validates itself once, on construction, and
every message names its key in conf/.

The draft length, in one vocabulary (docs/design.md section 2; verify/rules.py uses the same):
- num_draft_tokens: draft tokens one row verifies in one step (the paper's gamma; a [B] tensor per
  step, or verifier.num_draft_tokens, the constant schedule's value and the adaptive one's start).
- max_draft_len: the most draft tokens the adaptive and goodput schedules give a row
  (verifier.max_draft_len); `VerifierConfig.max_num_draft_tokens` is the most any step of a run
  verifies under the configured schedule (0 without a draft).
- num_drafted: draft tokens the proposer produced for a row in a step (a confidence stop may end a
  row's block early); the row verifies min(planned num_draft_tokens, num_drafted).
- g: in shapes and math, the width of a step's block (the largest num_draft_tokens of its rows);
  a step's `StepPlan.g`.
- draft_len_schedule: how num_draft_tokens is chosen (draft_length.py, goodput.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from distributed_spec.errors import ConfigError, require
from distributed_spec.verify import VERIFY_METHODS, SamplingParams

# "autoregressive" runs the target alone through the same loop (no draft loaded): the baseline.
ENGINE_METHODS = (*VERIFY_METHODS, "autoregressive")
DRAFT_LEN_SCHEDULES = ("constant", "adaptive", "goodput")
# What proposes the blocks (proposers.py).
PROPOSERS = ("model", "ngram", "model+ngram")
# Methods with a multi-path rule (verify/multipath.py).
MULTIPATH_METHODS = ("block", "greedy")
FINISH_REASONS = ("eos", "stop", "length")



@dataclass
class VerifierConfig:
    """The verification rule and what proposes the blocks (conf/verifier/*.yaml)."""

    # `block` (Sun et al. 2024), `token` (Leviathan et al. 2023), `greedy` (prefix match), or
    # `autoregressive` (the target alone, no draft: the baseline).
    method: str = "block"
    # Draft tokens a row verifies per step under the `constant` schedule (the start of `adaptive`).
    num_draft_tokens: int = 4
    # `constant`: num_draft_tokens every step. `adaptive`: per row, +2 after a fully kept block and
    # -1 otherwise, within [1, max_draft_len]. `goodput`: each step the count in {0, ..., max_draft_len}
    # with the most expected tokens per second on this device (0 = no draft). All exact.
    draft_len_schedule: str = "constant"
    # The most draft tokens the `adaptive` and `goodput` schedules give a row.
    max_draft_len: int = 8
    # A row's block ends after the first draft token whose draft probability is below this
    # (Hugging Face's assistant_confidence_threshold; exact for every method); 0 disables it.
    draft_confidence_threshold: float = 0.0
    # `model` (the draft model), `ngram` (prompt lookup in the row's own prompt and output; no draft
    # model is loaded; a row without a match verifies no draft) or `model+ngram` (n-gram where it
    # matches, the model elsewhere).
    proposer: str = "model"
    # The n-gram proposer matches the row's last n tokens, n from ngram_max down to ngram_min.
    ngram_min: int = 1
    ngram_max: int = 3
    # K draft paths per row and step, scored in one target forward; one path's prefix is kept
    # (docs/design.md section 7). 1: block verification as usual. K > 1: method block or greedy.
    num_paths: int = 1

    def __post_init__(self) -> None:
        require(
            self.method in ENGINE_METHODS,
            f"verifier.method={self.method!r} is unknown; choose one of {ENGINE_METHODS} (e.g. verifier=block)",
        )
        require(self.num_draft_tokens >= 1, f"verifier.num_draft_tokens must be >= 1, got {self.num_draft_tokens}")
        require(
            self.draft_len_schedule in DRAFT_LEN_SCHEDULES,
            f"verifier.draft_len_schedule={self.draft_len_schedule!r} is unknown; choose one of {DRAFT_LEN_SCHEDULES}",
        )
        require(self.max_draft_len >= 1, f"verifier.max_draft_len must be >= 1, got {self.max_draft_len}")
        require(
            self.draft_len_schedule != "adaptive" or self.max_draft_len >= self.num_draft_tokens,
            f"verifier.max_draft_len ({self.max_draft_len}) must be >= verifier.num_draft_tokens "
            f"({self.num_draft_tokens}) with verifier.draft_len_schedule=adaptive",
        )
        require(
            0.0 <= self.draft_confidence_threshold < 1.0,
            "verifier.draft_confidence_threshold must be in [0, 1) (0 disables it), "
            f"got {self.draft_confidence_threshold}",
        )
        require(
            self.proposer in PROPOSERS, f"verifier.proposer={self.proposer!r} is unknown; choose one of {PROPOSERS}"
        )
        require(
            self.proposer == "model" or self.method != "autoregressive",
            f"verifier.proposer={self.proposer} proposes blocks, but verifier.method=autoregressive verifies "
            "none; set verifier.proposer=model or pick a verifier (e.g. verifier=block)",
        )
        require(
            1 <= self.ngram_min <= self.ngram_max,
            "verifier.ngram_min and verifier.ngram_max need 1 <= ngram_min <= ngram_max, "
            f"got {self.ngram_min} and {self.ngram_max}",
        )
        require(self.num_paths >= 1, f"verifier.num_paths must be >= 1, got {self.num_paths}")
        require(
            self.num_paths == 1 or self.method in MULTIPATH_METHODS,
            f"verifier.num_paths={self.num_paths} needs a draft model and verifier.method in "
            f"{MULTIPATH_METHODS} (e.g. verifier=block), got verifier.method={self.method!r}",
        )
        require(
            self.num_paths == 1 or self.draft_confidence_threshold == 0,
            "verifier.num_paths > 1 needs verifier.draft_confidence_threshold=0 "
            "(every path of a row verifies the same number of drafts)",
        )
        require(
            self.num_paths == 1 or self.proposer == "model",
            f"verifier.num_paths > 1 draws its paths from the draft model: set verifier.proposer=model "
            f"(got {self.proposer!r}) or verifier.num_paths=1",
        )

    @property
    def uses_draft(self) -> bool:
        """Whether steps propose blocks at all (by the draft model or by n-grams)."""
        return self.method != "autoregressive"

    @property
    def uses_draft_model(self) -> bool:
        """Whether a draft model must be loaded and run (not for the baseline, nor for n-grams)."""
        return self.uses_draft and self.proposer != "ngram"

    @property
    def uses_ngram(self) -> bool:
        return self.uses_draft and self.proposer != "model"

    @property
    def max_num_draft_tokens(self) -> int:
        """The most draft tokens any row verifies in a step of a run (0 without a draft)."""
        if not self.uses_draft:
            return 0
        return self.num_draft_tokens if self.draft_len_schedule == "constant" else self.max_draft_len

    def describe_draft_len(self) -> str:
        """The draft-length settings in one short form, for directory names, logs and W&B tags:
        "d4" (constant 4), "d4a8" (adaptive from 4 up to 8), "dgp8" (goodput up to 8), then "c0.4"
        with the confidence stop and "k2" with 2 paths; "d0" for the autoregressive baseline."""
        if not self.uses_draft:
            return "d0"
        name = {
            "constant": f"d{self.num_draft_tokens}",
            "adaptive": f"d{self.num_draft_tokens}a{self.max_draft_len}",
            "goodput": f"dgp{self.max_draft_len}",
        }[self.draft_len_schedule]
        name += f"c{self.draft_confidence_threshold}" if self.draft_confidence_threshold else ""
        return name + (f"k{self.num_paths}" if self.num_paths != 1 else "")


@dataclass
class SamplingConfig:
    """How tokens are drawn (conf/sampling/*.yaml); the warping applies to draft and target alike."""

    # Softmax temperature; 0 is greedy.
    temperature: float = 1.0
    # Keep the k most likely tokens; 0 disables.
    top_k: int = 0
    # Nucleus mass; 1.0 disables.
    top_p: float = 1.0
    # Tokens to generate per record at most (finish_reason "length" when reached).
    max_new_tokens: int = 64
    # Seed of the run's random numbers: each record's generator is seeded from (seed, its id).
    seed: int = 0
    # Strings that end a completion; the completion is cut before the first one (needs a tokenizer).
    stop: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        require(self.max_new_tokens >= 1, f"sampling.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        require(all(self.stop), "sampling.stop must not contain empty strings")
        try:
            self.params  # noqa: B018 - validates temperature, top_k and top_p where the math defines them
        except ValueError as err:
            raise ConfigError(str(err)) from err

    @property
    def params(self) -> SamplingParams:
        """The warping of logits into probabilities (what each row of a step carries)."""
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)


@dataclass
class SchedulingConfig:
    """How the scheduler batches rows (conf/engine/*.yaml); data.batch_size rows decode at once."""

    # true: a finished row's place goes to the next record at the next step (continuous batching);
    # false: static batches (the next batch starts when the last row of the current one has ended).
    continuous_batching: bool = True
    # Prompt tokens a row feeds the target per step at most: a long prompt goes in by chunks beside
    # the other rows' blocks instead of stalling them; null: whole prompts.
    prefill_chunk_tokens: int | None = 256
    # A runner compacts its KV cache once padding and rejected slots exceed this fraction of it.
    compact_fraction: float = 0.5

    def __post_init__(self) -> None:
        require(
            self.prefill_chunk_tokens is None or self.prefill_chunk_tokens >= 1,
            f"engine.prefill_chunk_tokens must be >= 1 or null, got {self.prefill_chunk_tokens}",
        )
        require(
            0.0 < self.compact_fraction <= 1.0,
            f"engine.compact_fraction must be in (0, 1], got {self.compact_fraction}",
        )


@dataclass
class EngineConfig:
    """What the engine runs with: the three groups above, and what the job learns at load time."""

    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    scheduling: SchedulingConfig = field(default_factory=SchedulingConfig)
    # Rows decoded at once (data.batch_size).
    max_batch_size: int = 8
    # Token ids that end a sequence (kept as its last token; finish_reason "eos"): the tokenizer's
    # and the generation config's.
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        require(self.max_batch_size >= 1, f"data.batch_size must be >= 1, got {self.max_batch_size}")
        self.eos_token_ids = tuple(int(token_id) for token_id in self.eos_token_ids)


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

    # The most draft tokens a row verified in a step: the width of the per-position lists.
    max_num_draft_tokens: int = 0
    # Batched forward passes (each serves every active row at once); there is no separate prefill:
    # each batch's first draft and target forwards also process its prompts.
    num_target_calls: int = 0
    num_draft_calls: int = 0
    # Tokens generated over all rows.
    num_tokens: int = 0
    # Sum over target calls of the rows they served: the denominator of block efficiency.
    num_row_iterations: int = 0
    # [max_num_draft_tokens] per draft position i: rows that verified a draft token at i / that kept it.
    num_proposed_per_position: list[int] = field(default_factory=list)
    num_accepted_per_position: list[int] = field(default_factory=list)
    # [max_num_draft_tokens + 1] steps whose block was g wide, g = 0 (no draft) .. max_num_draft_tokens.
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
        """[max_num_draft_tokens] fraction of the iterations verifying draft position i in which it was kept."""
        return [
            accepted / proposed if proposed else 0.0
            for accepted, proposed in zip(self.num_accepted_per_position, self.num_proposed_per_position)
        ]

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.total_s if self.total_s > 0 else 0.0

    def merge(self, other: RunStats) -> RunStats:
        width = max(self.max_num_draft_tokens, other.max_num_draft_tokens)

        def padded(counts: list[int]) -> list[int]:
            return counts + [0] * (width - len(counts))

        steps_a, steps_b = self.num_steps_per_draft_len, other.num_steps_per_draft_len
        num_lengths = max(len(steps_a), len(steps_b))
        extra = dict(self.extra)
        for name, value in other.extra.items():
            extra[name] = extra.get(name, 0.0) + value
        return RunStats(
            max_num_draft_tokens=width,
            num_steps_per_draft_len=[
                a + b
                for a, b in zip(
                    steps_a + [0] * (num_lengths - len(steps_a)), steps_b + [0] * (num_lengths - len(steps_b))
                )
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
