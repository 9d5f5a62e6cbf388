"""The engine with K draft paths per row (engine.num_paths, multipath_step.py).

    .venv/bin/python -m pytest tests/engine/test_multipath_engine.py -q

Greedy output equals greedy autoregressive output; sampled output equals, token for token, a
reference that recomputes every probability without a cache (so forking, scoring K paths in one
forward and keeping one path leave both caches exactly as the kept tokens); a row's output does not
depend on its batch; the scheduler's draws at K > 1. The target distribution of the first tokens:
tests/engine/test_distribution.py.
"""

from __future__ import annotations

import pytest
import torch

from distributed_spec.engine import EngineConfig, SpeculativeEngine
from distributed_spec.engine.config import SamplingConfig, SchedulingConfig, VerifierConfig
from distributed_spec.engine.scheduler import Request, draw_path_uniforms, request_seed
from distributed_spec.models.tiny import perturbed_copy
from distributed_spec.verify import (
    MultiPathUniforms,
    SamplingParams,
    logits_to_probs,
    sample_from_probs,
    verify_paths,
)
from tests.configs import engine_replace
from tests.engine import test_greedy
from tests.engine.test_greedy import MAX_NEW_TOKENS, PROMPTS

SAMPLED = SamplingParams(temperature=1.0)
# The greedy autoregressive outputs of PROMPTS (a module fixture of test_greedy.py).
autoregressive_outputs = test_greedy.autoregressive_outputs


@pytest.mark.parametrize("draft_len_schedule", ["constant", "goodput"])
@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("num_paths", [2, 4])
@pytest.mark.parametrize("method", ["block", "greedy"])
def test_greedy_multipath_equals_greedy_autoregressive(
    tiny_pair, autoregressive_outputs, steady_steps, method, num_paths, batch_size, draft_len_schedule
):
    target, draft = tiny_pair
    config = EngineConfig(
        verifier=VerifierConfig(
            method=method,
            num_draft_tokens=3,
            num_paths=num_paths,
            draft_len_schedule=draft_len_schedule,
            max_draft_len=4,
        ),
        sampling=SamplingConfig(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS),
        scheduling=SchedulingConfig(prefill_chunk_tokens=2),
    )
    results, stats = SpeculativeEngine(target, draft, config).generate_with_stats(PROMPTS[batch_size])
    assert [result.token_ids for result in results] == [
        result.token_ids for result in autoregressive_outputs[batch_size]
    ]
    assert 0 < sum(stats.num_accepted_per_position) < sum(stats.num_proposed_per_position)


def _reference_multipath(
    target, draft, prompt: list[int], config: EngineConfig, key
) -> tuple[list[int], list[int]]:
    """Constant-g multi-path decoding of one prompt with fresh forwards (no KV cache), drawing the
    uniforms as the scheduler does. Returns the output and the kept path of every step."""
    generator = Request(key=key, prompt_ids=prompt, budget=0, seed=request_seed(config.sampling.seed, key)).generator
    g, num_paths, params = config.verifier.num_draft_tokens, config.verifier.num_paths, config.sampling.params
    output: list[int] = []
    kept_paths: list[int] = []
    with torch.no_grad():
        while len(output) < config.sampling.max_new_tokens:
            context = prompt + output
            num_drafts = min(g, config.sampling.max_new_tokens - len(output) - 1)
            if num_drafts == 0:  # a plain decoding step: one uniform
                u = torch.rand(1, generator=generator, dtype=torch.float64)
                probs = logits_to_probs(target(torch.tensor([context])).logits[:, -1], params)
                output.append(int(sample_from_probs(probs, u)[0]))
                continue
            size = num_paths * num_drafts
            draws = torch.rand(2 * size + 1, generator=generator, dtype=torch.float64)
            draft_uniforms = draws[:size].view(num_paths, num_drafts)
            paths, path_q = [], []
            for k in range(num_paths):
                path, q = [], []
                for i in range(num_drafts):
                    probs = logits_to_probs(draft(torch.tensor([context + path])).logits[:, -1], params)
                    path.append(int(sample_from_probs(probs, draft_uniforms[k, i : i + 1])[0]))
                    q.append(probs[0])
                paths.append(path)
                path_q.append(torch.stack(q))
            ids = torch.tensor([paths])  # [1, K, n]
            target_logits = target(torch.tensor([context + path for path in paths])).logits[
                :, -num_drafts - 1 :
            ]
            verified = verify_paths(
                config.verifier.method,
                ids,
                torch.stack(path_q)[None],
                logits_to_probs(target_logits, params)[None],
                None,
                MultiPathUniforms(eta=draws[size : 2 * size].view(1, num_paths, num_drafts), u=draws[-1:]),
            )
            tau, path = int(verified.accepted_counts[0]), int(verified.path_indices[0])
            output.extend(paths[path][:tau] + [int(verified.next_tokens[0])])
            kept_paths.append(path)
    return output[: config.sampling.max_new_tokens], kept_paths


@pytest.mark.parametrize("num_paths", [2, 3])
def test_sampled_multipath_equals_a_reference_without_cache(tiny_pair, num_paths):
    target, _ = tiny_pair
    # A draft that often disagrees with the target: later paths get kept too.
    draft = perturbed_copy(target, noise=1.0, seed=1)
    config = EngineConfig(
        verifier=VerifierConfig(method="block", num_draft_tokens=3, num_paths=num_paths),
        sampling=SamplingConfig(temperature=1.0, max_new_tokens=20, seed=6),
        max_batch_size=3,
    )
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]
    results = SpeculativeEngine(target, draft, config).generate(prompts)
    kept_paths = []
    for index, (prompt, result) in enumerate(zip(prompts, results)):
        expected, paths = _reference_multipath(target, draft, prompt, config, index)
        assert result.token_ids == expected
        kept_paths += paths
    assert 0 in kept_paths and max(kept_paths) > 0


def test_a_prompt_decodes_the_same_alone_or_in_any_batch(tiny_pair):
    """Per-row draws of K paths: batch, continuous vs static batching and prompt chunks do not matter."""
    target, draft = tiny_pair
    prompts = [[(5 * index + offset) % 60 + 2 for offset in range(1 + index % 7)] for index in range(10)]
    config = EngineConfig(
        verifier=VerifierConfig(method="block", num_draft_tokens=3, num_paths=3),
        sampling=SamplingConfig(temperature=1.0, max_new_tokens=12, seed=3),
        max_batch_size=1,
    )

    def decode(batch_size: int, **overrides) -> list[list[int]]:
        engine = SpeculativeEngine(target, draft, engine_replace(config, max_batch_size=batch_size, **overrides))
        return [result.token_ids for result in engine.generate(prompts)]

    alone = decode(1)
    assert decode(10) == alone
    assert decode(3, prefill_chunk_tokens=2) == alone
    assert decode(4, continuous_batching=False) == alone


def test_multipath_draws_are_k_paths_then_eta_then_u():
    rows = [Request(key=key, prompt_ids=[1], budget=9, seed=key) for key in (0, 1, 2)]
    draft_uniforms, eta, u = draw_path_uniforms(rows, [2, 3, 0], [True, True, False], g=3, num_paths=2)
    assert draft_uniforms.shape == eta.shape == (3, 2, 3) and u.shape == (3,)
    expected = torch.rand(13, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.testing.assert_close(draft_uniforms[1].flatten(), expected[:6], rtol=0, atol=0)
    torch.testing.assert_close(eta[1].flatten(), expected[6:12], rtol=0, atol=0)
    assert u[1] == expected[12]
    # Row 0 verifies 2 of 3 columns; row 2 is not decoding: nothing is drawn past a row's n.
    assert (draft_uniforms[0, :, 2] == 0.5).all() and (eta[0, :, 2] == 1).all() and (eta[2] == 1).all()


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"num_paths": 0}, "num_paths must be >= 1"),
        ({"num_paths": 2, "method": "token"}, "num_paths=2 needs a draft model and verifier.method"),
        ({"num_paths": 2, "draft_confidence_threshold": 0.2}, "draft_confidence_threshold=0"),
    ],
)
def test_bad_num_paths_is_rejected(overrides, message):
    with pytest.raises(ValueError, match=message):
        VerifierConfig(**overrides)


def test_the_ray_runtime_rejects_several_paths_with_vocab_parallel_verification():
    """K paths are verified on the full logits (parallel.verify=gather); the Ray runtime itself runs
    them: tests/distributed/test_multipath_ray.py."""
    pytest.importorskip("ray")
    from distributed_spec.config import ConfigError, ParallelConfig
    from distributed_spec.distributed.coordinator import RayCoordinator

    runtime = ParallelConfig(runtime="ray", device="cpu", backend="gloo", tp_size=2, verify="vocab_parallel")
    with pytest.raises(ConfigError, match="num_paths=2.*parallel.verify=vocab_parallel"):
        RayCoordinator(
            object(), object(), EngineConfig(verifier=VerifierConfig(num_paths=2)), runtime
        )
