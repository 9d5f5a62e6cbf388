"""Single-process speculative decoding engine (the reference loop the distributed runtime replays).

    from distributed_spec.engine import EngineConfig, SamplingConfig, SpeculativeEngine, VerifierConfig
    config = EngineConfig(VerifierConfig(method="block", num_draft_tokens=4), SamplingConfig(max_new_tokens=64))
    engine = SpeculativeEngine(target_model, draft_model, config)
    results, stats = engine.generate_with_stats([[1, 2, 3], [4, 5]])   # list[GenerationResult], RunStats

API (the terms of the draft length are defined in config.py's docstring):
- EngineConfig(verifier: VerifierConfig, sampling: SamplingConfig, scheduling: SchedulingConfig,
  max_batch_size, eos_token_ids): the conf/ groups verifier, sampling and engine as they are, plus
  what the job learns at load time. The draft-length schedules are in draft_length.py and goodput.py,
  the proposers in proposers.py and ngram.py.
- SpeculativeEngine(target, draft | None, config, tokenizer=None)
    .generate(prompts_token_ids, tokenizer=None) -> list[GenerationResult]
    .generate_with_stats(...) -> (list[GenerationResult], RunStats)
    .target_runner / .draft_runner: the ModelRunners it drives.
- Scheduler(config, executor, tokenizer) (scheduler.py): the one loop, over a LocalExecutor here or
  the Ray runtime's executor.
- GenerationResult(token_ids, finish_reason in {"eos", "stop", "length"}, stats: RowStats).
- RunStats: num_target_calls, num_draft_calls, num_tokens, block_efficiency,
  acceptance_per_position, mean_accepted_length, tokens_per_s, draft_s/target_s/verify_s/other_s,
  total_s; .merge(other), .as_dict().
- ModelRunner(model): a model + its batched KV cache. Verbs: start(prompt_ids) (staged: they go in with
  the next forward), prefill(prompt_ids) -> logits [B, V],
  forward_tokens(input_ids [B, n], input_mask [B, n]) -> logits [B, n, V],
  rollback(num_kept [B], num_new_slots), drop_rows(keep_rows [B']), compact().
- Steps of one iteration (steps.py), the pieces the Ray runtime replays:
  propose(draft_runner, draft_input_ids, draft_input_mask, g, sampling, draft_uniforms [B, g],
          confidence_threshold=0.0) -> draft_ids [B, g'], draft_probs [B, g', V], num_draft_tokens [B]
  score(target_runner, last_ids [B], draft_ids [B, g]) -> target_logits [B, g+1, V]
  distributed_spec.verify.verify_logits(method, ..., target_logits, ..., sampling) -> VerifyOutput
      (the fused Triton kernel on CUDA, the torch rules elsewhere)
  commit_target(target_runner, accepted_counts, g)
  commit_draft(draft_runner, draft_ids, accepted_counts, next_tokens) -> next draft_input_ids/mask [B, 2]

Names are imported on first use (PEP 562): the job's configuration imports engine/config.py, which
must not wait for transformers.
"""

from __future__ import annotations

from distributed_spec.lazy_exports import lazy_exports

_EXPORTS = {
    "config": (
        "DRAFT_LEN_SCHEDULES",
        "ENGINE_METHODS",
        "FINISH_REASONS",
        "EngineConfig",
        "GenerationResult",
        "RowStats",
        "RunStats",
        "SamplingConfig",
        "SchedulingConfig",
        "VerifierConfig",
    ),
    "executor": ("LocalExecutor", "StepOutcome", "StepPlan"),
    "runner": ("ModelRunner",),
    "scheduler": ("BatchLost", "Request", "Scheduler", "request_seed"),
    "speculative": ("SpeculativeEngine",),
    "steps": ("commit_draft", "commit_target", "propose", "sample_autoregressive", "score"),
}

__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__ = lazy_exports(__name__, _EXPORTS)
