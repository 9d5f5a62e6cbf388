"""SpeculativeEngine: the single-process engine (the scheduler over in-process models).

    from distributed_spec.engine import EngineConfig, SpeculativeEngine, VerifierConfig
    config = EngineConfig(VerifierConfig(method="block", num_draft_tokens=4))
    results = SpeculativeEngine(target_model, draft_model, config).generate([[1, 2, 3], [4, 5]])

It builds a ModelRunner per model, a LocalExecutor over them (executor.py) and runs the scheduler
(scheduler.py): continuous batching of `max_batch_size` rows, each row's prompt going in with its
first forwards (no separate prefill call), propose -> score -> verify -> commit per step (steps.py,
sides.py), rows finishing on an EOS id, a stop string or their budget. Every generated token comes
out of a decoding step, so block efficiency = tokens / (row, target call) pairs. The
"autoregressive" method is the same loop with g = 0 and no draft: the baseline.

Randomness: each prompt has its own torch.Generator, seeded from (sampling.seed, the prompt's
key: its index, or the key the caller gives), so a prompt's output does not depend on its batch.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from transformers import PreTrainedModel

from distributed_spec.engine.config import EngineConfig, GenerationResult, RunStats
from distributed_spec.engine.executor import LocalExecutor
from distributed_spec.engine.runner import ModelRunner
from distributed_spec.engine.scheduler import Request, Scheduler, request_seed
from distributed_spec.engine.stopping import prompt_budgets
from distributed_spec.models.pair import ModelFacts, check_pair
from distributed_spec.verify import SamplingParams

logger = logging.getLogger(__name__)


class SpeculativeEngine:
    """Batched speculative decoding of `target` with `draft` (None for "autoregressive" and proposer "ngram")."""

    def __init__(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel | None,
        config: EngineConfig,
        tokenizer=None,
        max_context_len: int | None = None,
    ) -> None:
        """max_context_len: model.max_context_len, a cap under the models' max_position_embeddings."""
        self.config = config
        self.tokenizer = tokenizer
        self.target_runner = ModelRunner(target, config.scheduling.compact_fraction)
        self.draft_runner: ModelRunner | None = None
        self.device = self.target_runner.device
        if config.verifier.uses_draft_model:
            if draft is None:
                raise ValueError(
                    f"verifier.method={config.verifier.method!r} with verifier.proposer={config.verifier.proposer!r} needs a draft "
                    "model; set verifier.proposer=ngram (no draft model) or verifier.method=autoregressive"
                )
            self.draft_runner = ModelRunner(draft, config.scheduling.compact_fraction)
            if self.draft_runner.device != self.device:
                raise ValueError(
                    f"draft is on {self.draft_runner.device} but target is on {self.device}: "
                    "set both models' device to the same value"
                )
        # The pair's one check (vocabulary, context): models/pair.py.
        self.max_context = check_pair(
            ModelFacts.of_model(target),
            ModelFacts.of_model(draft) if self.draft_runner is not None else None,
            max_context_len,
        )

        self.executor = LocalExecutor(self.target_runner, self.draft_runner)
        self.executor.max_context = self.max_context
        # Tests: called with the step index after each step.
        self.on_step = None

    @property
    def vocab_size(self) -> int:
        return self.target_runner.vocab_size

    def generate(self, prompts_token_ids: Sequence[Sequence[int]], tokenizer=None) -> list[GenerationResult]:
        """Generate for every prompt (token ids); results are in prompt order."""
        return self.generate_with_stats(prompts_token_ids, tokenizer)[0]

    def generate_with_stats(
        self, prompts_token_ids: Sequence[Sequence[int]], tokenizer=None, keys: Sequence | None = None
    ) -> tuple[list[GenerationResult], RunStats]:
        """Like `generate`, also returning the statistics of the run. keys: per prompt, what seeds its
        generator with sampling.seed (default: its index)."""
        requests = build_requests(
            prompts_token_ids, self.config, self.target_runner.vocab_size, self.max_context, keys
        )
        scheduler = self.scheduler(tokenizer)
        finished = {id(request): request for request in scheduler.run(requests)}
        results = [to_result(finished[id(request)]) for request in requests]
        return results, scheduler.stats

    def scheduler(self, tokenizer=None) -> Scheduler:
        """A scheduler over this engine's models (its `run` streams requests as they finish)."""
        scheduler = Scheduler(self.config, self.executor, tokenizer or self.tokenizer)
        scheduler.on_step = self.on_step
        return scheduler

    def stream(self, requests: Iterable[Request], tokenizer=None) -> Iterator[Request]:
        """Decode a stream of requests with continuous batching; yields each as it finishes."""
        return self.scheduler(tokenizer).run(requests)


def build_requests(
    prompts_token_ids: Sequence[Sequence[int]],
    config: EngineConfig,
    vocab_size: int,
    max_context: int | None,
    keys: Sequence | None = None,
) -> list[Request]:
    """Validated requests for prompts (token ids); each seeded from (config.sampling.seed, its key)."""
    prompts = [list(map(int, prompt)) for prompt in prompts_token_ids]
    budgets = prompt_budgets(prompts, vocab_size, max_context, config.sampling.max_new_tokens)
    keys = list(range(len(prompts))) if keys is None else list(keys)
    return [
        Request(key=key, prompt_ids=prompt, budget=budget, seed=request_seed(config.sampling.seed, key))
        for key, prompt, budget in zip(keys, prompts, budgets)
    ]


def make_request(
    prompt_ids: Sequence[int],
    config: EngineConfig,
    vocab_size: int,
    max_context: int | None,
    key: Any,
    seed_key: Any,
    max_new_tokens: int | None = None,
    sampling: SamplingParams | None = None,
    seed: int | None = None,
    stop_strings: Sequence[str] | None = None,
) -> Request:
    """A validated request (ValueError names what is wrong); its generator is seeded from
    (config.sampling.seed, seed_key), or from `seed` when given (a record's own seed); its budget is
    max_new_tokens (default config's) clipped to the context; sampling and stop_strings default to
    config's."""
    prompt = list(map(int, prompt_ids))
    limit = config.sampling.max_new_tokens if max_new_tokens is None else max_new_tokens
    (budget,) = prompt_budgets([prompt], vocab_size, max_context, limit)
    sampling = config.sampling.params if sampling is None else sampling
    if config.verifier.method == "greedy" and not sampling.is_greedy:
        raise ValueError(f"the greedy verifier needs temperature 0, got {sampling.temperature}")
    if stop_strings is not None and any(not stop for stop in stop_strings):
        raise ValueError("stop strings must not be empty")
    return Request(
        key=key,
        prompt_ids=prompt,
        budget=budget,
        # torch generators take seeds in [0, 2^64): a record's seed is used modulo that.
        seed=request_seed(config.sampling.seed, seed_key) if seed is None else seed % (1 << 64),
        sampling=sampling,
        stop_strings=None if stop_strings is None else tuple(stop_strings),
    )


def to_result(request: Request) -> GenerationResult:
    request.stats.num_tokens = len(request.output)
    return GenerationResult(token_ids=request.output, finish_reason=request.finish_reason, stats=request.stats)
