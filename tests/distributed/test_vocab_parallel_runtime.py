"""parallel.verify=vocab_parallel in the Ray runtime: each TP = 2 shard scores and verifies its
vocabulary slice (no rank computes the full logits), and the output is the single-process engine's,
token for token, greedy and sampled (same seed: the runtime and the engine share uniforms).

    timeout 600 .venv/bin/python -m pytest tests/distributed/test_vocab_parallel_runtime.py -x -q
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import ray

from distributed_spec.distributed import RayCoordinator
from distributed_spec.distributed.factories import TinyLlamaFactory
from distributed_spec.engine import EngineConfig, SpeculativeEngine
from distributed_spec.engine.config import SamplingConfig, VerifierConfig
from distributed_spec.engine.speculative import make_request
from distributed_spec.verify import SamplingParams
from tests.configs import engine_replace
from tests.distributed.conftest import ray_config

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

# 65 ids: slices of 33 and 32, so the last shard is the shorter one (vocab_shard_range).
VOCAB_SIZE = 65
TARGET = TinyLlamaFactory(vocab_size=VOCAB_SIZE, num_layers=2, hidden=32, seed=0, logit_scale=16.0)
DRAFT = TinyLlamaFactory(vocab_size=VOCAB_SIZE, num_layers=2, hidden=32, seed=0, logit_scale=16.0, noise=0.2)
PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16], [3], [20, 21, 22]]
GREEDY = EngineConfig(
    VerifierConfig(method="block", num_draft_tokens=4),
    SamplingConfig(temperature=0.0, max_new_tokens=20),
    max_batch_size=4,
)
RUNTIME = ray_config(
    tp_size=2, num_cpus_per_shard=0.5, num_cpus_draft=0.5, step_timeout_s=60.0, verify="vocab_parallel"
)


def engine_results(config: EngineConfig, prompts=PROMPTS):
    draft = DRAFT() if config.verifier.uses_draft_model else None
    return SpeculativeEngine(TARGET(), draft, config).generate_with_stats(prompts)


@pytest.fixture(scope="module")
def tp2(ray_cluster):
    coordinator = RayCoordinator(TARGET, DRAFT, GREEDY, RUNTIME).start()
    yield coordinator
    coordinator.close()


def test_each_shard_scores_only_its_vocabulary_slice(tp2):
    tp2.config, tp2.runtime = GREEDY, RUNTIME
    tp2.generate(PROMPTS[:1])
    widths = ray.get([shard.output_width.remote() for shard in tp2.actors.shards])
    assert widths == [33, 32]


@pytest.mark.parametrize(
    ("method", "wire_dtype", "wire_top_k", "overlap"),
    [("block", "float32", 0, False), ("greedy", "float32", 0, False), ("token", "bfloat16", 8, True),
     ("autoregressive", "float32", 0, False)],
)
def test_greedy_output_identical_to_engine(tp2, method, wire_dtype, wire_top_k, overlap):
    tp2.config = engine_replace(GREEDY, method=method)
    tp2.runtime = replace(RUNTIME, wire_dtype=wire_dtype, wire_top_k=wire_top_k, overlap=overlap)
    results, stats = tp2.generate_with_stats(PROMPTS)
    reference, reference_stats = engine_results(tp2.config)
    assert [r.token_ids for r in results] == [r.token_ids for r in reference]
    assert stats.num_target_calls == reference_stats.num_target_calls or overlap


@pytest.mark.parametrize(
    ("method", "sampling", "wire", "draft_length"),
    [
        ("block", SamplingParams(temperature=1.0), {}, {}),
        ("token", SamplingParams(temperature=0.8, top_k=10), {}, {}),
        # top-p sorts over V: verify_parallel gathers the logits for it (the fallback), still exact.
        ("block", SamplingParams(temperature=1.0, top_p=0.9), {}, {"draft_len_schedule": "adaptive"}),
        ("block", SamplingParams(temperature=1.0), {}, {"draft_confidence_threshold": 0.3}),
        ("autoregressive", SamplingParams(temperature=1.0), {}, {}),
    ],
)
def test_sampling_replays_the_engine_exactly(tp2, method, sampling, wire, draft_length):
    """Same seed, same order of uniforms: the same tokens as the engine, not just the same law."""
    tp2.config = engine_replace(GREEDY, method=method, sampling=sampling, seed=3, **draft_length)
    tp2.runtime = replace(RUNTIME, **wire)
    results = tp2.generate(PROMPTS)
    reference, _ = engine_results(tp2.config)
    assert [r.token_ids for r in results] == [r.token_ids for r in reference]


@pytest.mark.parametrize("wire", [{"wire_dtype": "bfloat16"}, {"wire_top_k": 8}])
def test_sampling_with_rounded_or_sparse_q_equals_gather(tp2, wire):
    """A rounded or top-k q changes what the draft proposes (the engine sends no q, so it is not the
    reference here): the gather mode of the same runtime is, and the draws are the same."""
    tp2.config = engine_replace(GREEDY, sampling=SamplingParams(temperature=1.0), seed=4)
    tp2.runtime = replace(RUNTIME, verify="gather", **wire)
    gathered = tp2.generate(PROMPTS)
    tp2.runtime = replace(RUNTIME, **wire)
    assert [r.token_ids for r in tp2.generate(PROMPTS)] == [r.token_ids for r in gathered]


def test_ngram_blocks_replay_the_engine_exactly(tp2):
    """Point-mass q (one (value, id) pair per token) reaches every shard whole."""
    prompts = PROMPTS + [[4, 5, 4, 5, 4], [7, 8, 9, 7, 8]]
    tp2.config = engine_replace(GREEDY, sampling=SamplingParams(temperature=0.5), seed=9, proposer="model+ngram")
    tp2.runtime = RUNTIME
    results, stats = tp2.generate_with_stats(prompts)
    reference, _ = engine_results(tp2.config, prompts)
    assert [r.token_ids for r in results] == [r.token_ids for r in reference]
    assert stats.extra["proposer/accepted_ngram"] > 0


def test_rows_with_their_own_settings_replay_the_engine(tp2):
    """Per-row sampling: each group of rows sharing settings is verified together on the shards."""
    settings = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9),
                SamplingParams(temperature=0.0), SamplingParams(temperature=1.3, top_k=5), SamplingParams(temperature=1.0)]
    seeds = [None, 1234, None, 5, 99]
    config = engine_replace(GREEDY, sampling=SamplingParams(temperature=1.0), seed=3, max_batch_size=8)
    tp2.config, tp2.runtime = config, RUNTIME
    engine = SpeculativeEngine(TARGET(), DRAFT(), config)
    assert _decode(tp2, tp2.actors.max_context, config, settings, seeds) == _decode(
        engine, engine.max_context, config, settings, seeds
    )


def test_gather_and_vocab_parallel_batches_share_one_launched_runtime(tp2):
    """The mode is a per-batch setting: the shards swap their output head at `begin`."""
    tp2.config = engine_replace(GREEDY, sampling=SamplingParams(temperature=1.0), seed=5)
    tp2.runtime = replace(RUNTIME, verify="gather")
    gathered = tp2.generate(PROMPTS)
    widths = ray.get([shard.output_width.remote() for shard in tp2.actors.shards])
    tp2.runtime = RUNTIME
    assert [r.token_ids for r in tp2.generate(PROMPTS)] == [r.token_ids for r in gathered]
    assert widths == [VOCAB_SIZE, VOCAB_SIZE]


def _decode(backend, max_context, config, settings, seeds):
    requests = [
        make_request(prompt, config, VOCAB_SIZE, max_context, key=index, seed_key=index, sampling=params, seed=seed)
        for index, (prompt, params, seed) in enumerate(zip(PROMPTS, settings, seeds))
    ]
    finished = {request.key: request.output for request in backend.stream(requests)}
    return [finished[index] for index in range(len(PROMPTS))]
