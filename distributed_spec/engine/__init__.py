"""Single-process speculative decoding engine (the reference loop the distributed runtime replays).

    from distributed_spec.engine import EngineConfig, SpeculativeEngine
    engine = SpeculativeEngine(target_model, draft_model, EngineConfig(method="block", gamma=4, max_new_tokens=64))
    results, stats = engine.generate_with_stats([[1, 2, 3], [4, 5]])   # list[GenerationResult], RunStats

API:
- EngineConfig(method="block"|"token"|"greedy"|"autoregressive", gamma, gamma_schedule="constant"|"adaptive",
  max_gamma, proposer="model"|"ngram"|"model+ngram", ngram_min, ngram_max, sampling=SamplingParams(...),
  max_new_tokens, max_batch_size, seed, eos_token_ids, stop_strings, compact_fraction). The draft-length
  schedules are in draft_length.py, the proposers in proposers.py and ngram.py.
- SpeculativeEngine(target, draft | None, config, tokenizer=None)
    .generate(prompts_token_ids, tokenizer=None) -> list[GenerationResult]
    .generate_with_stats(...) -> (list[GenerationResult], RunStats)
    .target_runner / .draft_runner: the ModelRunners it drives.
- GenerationResult(token_ids, finish_reason in {"eos", "stop", "length"}, stats: RowStats).
- RunStats: num_target_calls, num_draft_calls, num_tokens, block_efficiency,
  acceptance_per_position, mean_accepted_length, tokens_per_s, draft_s/target_s/verify_s/other_s,
  total_s; .merge(other), .as_dict().
- ModelRunner(model): a model + its batched KV cache. Verbs: start(prompt_ids) (staged: they go in with
  the next forward), prefill(prompt_ids) -> logits [B, V],
  forward_tokens(input_ids [B, n], input_mask [B, n]) -> logits [B, n, V],
  rollback(num_kept [B], num_new_slots), drop_rows(keep_rows [B']), compact().
- Steps of one iteration (steps.py), the pieces the Ray coordinator replays:
  propose(draft_runner, draft_input_ids, draft_input_mask, g, sampling, draft_uniforms [B, g],
          confidence_threshold=0.0) -> draft_ids [B, g'], draft_probs [B, g', V], num_drafted [B]
  score(target_runner, last_ids [B], draft_ids [B, g]) -> target_logits [B, g+1, V]
  distributed_spec.verify.verify_logits(method, ..., target_logits, ..., sampling) -> VerifyOutput
      (the fused Triton kernel on CUDA, the torch rules elsewhere)
  commit_target(target_runner, accepted_counts, g)
  commit_draft(draft_runner, draft_ids, accepted_counts, next_tokens) -> next draft_input_ids/mask [B, 2]
"""

from distributed_spec.engine.config import (
    ENGINE_METHODS,
    FINISH_REASONS,
    EngineConfig,
    GenerationResult,
    RowStats,
    RunStats,
)
from distributed_spec.engine.executor import LocalExecutor, StepOutcome, StepPlan
from distributed_spec.engine.runner import ModelRunner
from distributed_spec.engine.scheduler import BatchLost, Request, Scheduler, request_seed
from distributed_spec.engine.speculative import SpeculativeEngine
from distributed_spec.engine.steps import commit_draft, commit_target, propose, sample_autoregressive, score

__all__ = [
    "ENGINE_METHODS",
    "FINISH_REASONS",
    "EngineConfig",
    "BatchLost",
    "GenerationResult",
    "LocalExecutor",
    "ModelRunner",
    "Request",
    "Scheduler",
    "StepOutcome",
    "StepPlan",
    "RowStats",
    "RunStats",
    "SpeculativeEngine",
    "commit_draft",
    "commit_target",
    "propose",
    "request_seed",
    "sample_autoregressive",
    "score",
]
