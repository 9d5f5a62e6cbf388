"""K draft paths per row (verifier.num_paths > 1) in the Ray runtime against the local engine, token
for token, on tiny random Llamas (one local Ray cluster; a TP = 1 and a TP = 2 runtime).

    timeout 600 .venv/bin/python -m pytest tests/distributed/test_multipath_ray.py -x -q

The draft actor forks its rows K ways and sends [B, K, g] blocks; the shards fork theirs, score
every path in one forward, rank 0 verifies the paths and every rank keeps the kept path
(engine/multipath_step.py's halves, docs/design.md section 7). The same job gives the same tokens
as the single-process engine (float32 q on the CPU wire), greedy and sampled, also while rows join
mid-run with their prompts fed by chunks in the steps where the others' paths fork.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from distributed_spec.config import ConfigError
from distributed_spec.distributed import RayCoordinator
from distributed_spec.distributed.factories import TinyLlamaFactory
from distributed_spec.engine import EngineConfig, SpeculativeEngine
from distributed_spec.engine.config import SamplingConfig, VerifierConfig
from distributed_spec.verify import SamplingParams
from tests.configs import engine_replace
from tests.distributed.conftest import ray_config

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

VOCAB_SIZE = 64
# Noisy enough that paths differ and blocks are often rejected part-way at temperature 1.
TARGET = TinyLlamaFactory(vocab_size=VOCAB_SIZE, num_layers=2, hidden=32, seed=0, logit_scale=8.0)
DRAFT = TinyLlamaFactory(vocab_size=VOCAB_SIZE, num_layers=2, hidden=32, seed=0, logit_scale=8.0, noise=0.3)
PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16], [3], [20, 21, 22]]
CONFIG = EngineConfig(
    verifier=VerifierConfig(method="block", num_draft_tokens=3, num_paths=2, draft_len_schedule="constant"),
    sampling=SamplingConfig(temperature=1.0, max_new_tokens=16, seed=3),
    max_batch_size=5,
)
RUNTIME = ray_config(
    tp_size=2, num_cpus_per_shard=0.5, num_cpus_draft=0.5, step_timeout_s=60.0, wire_dtype="float32"
)
# Rows join mid-run (3 at a time), prompts up to 11 tokens fed 4 at a time.
JOINING_PROMPTS = [[(3 * i + j) % VOCAB_SIZE for j in range(1 + (5 * i) % 11)] for i in range(8)]


def engine_results(config: EngineConfig, prompts):
    return SpeculativeEngine(TARGET(), DRAFT(), config).generate_with_stats(prompts)


@pytest.fixture(
    scope="module",
    params=[(1, False), (2, False), (2, True)],
    ids=["tp1", "tp2", "tp2-draft-in-shard"],
)
def runtime(ray_cluster, request):
    """A launched runtime at TP = 1, at TP = 2, and at TP = 2 with the draft inside shard 0
    (parallel.draft_in_shard: rank 0 broadcasts the [B, K, g] ids), each reused by every test of its turn."""
    tp_size, draft_in_shard = request.param
    coordinator = RayCoordinator(
        TARGET, DRAFT, CONFIG, replace(RUNTIME, tp_size=tp_size, draft_in_shard=draft_in_shard)
    ).start()
    yield coordinator
    coordinator.close()


def use_runtime(coordinator: RayCoordinator, **changes) -> None:
    """The module's RUNTIME at the coordinator's TP size, with `changes` (each test sets its own)."""
    coordinator.runtime = replace(
        RUNTIME, tp_size=coordinator.runtime.tp_size, draft_in_shard=coordinator.runtime.draft_in_shard, **changes
    )


def assert_ray_equals_engine(coordinator: RayCoordinator, config: EngineConfig, prompts) -> None:
    coordinator.config = config
    results, stats = coordinator.generate_with_stats(prompts)
    reference, reference_stats = engine_results(config, prompts)
    assert [r.token_ids for r in results] == [r.token_ids for r in reference]
    assert stats.block_efficiency == pytest.approx(reference_stats.block_efficiency)
    assert stats.num_target_calls == reference_stats.num_target_calls
    # The pair must accept some drafts, and not all, for the comparison to mean anything.
    assert 0 < sum(stats.num_accepted_per_position) < sum(stats.num_proposed_per_position)


@pytest.mark.parametrize(
    ("method", "temperature", "num_paths", "wire"),
    [
        ("block", 0.0, 2, {}),
        # q of K paths in bfloat16, top-k: one-hot at temperature 0, so the same tokens still.
        ("block", 0.0, 2, {"wire_dtype": "bfloat16", "wire_top_k": 8}),
        ("greedy", 0.0, 3, {}),
        ("block", 1.0, 2, {}),
        ("block", 1.0, 3, {}),
    ],
)
def test_paths_replay_the_engine_exactly(runtime, method, temperature, num_paths, wire):
    config = engine_replace(
        CONFIG, method=method, sampling=SamplingParams(temperature=temperature), num_paths=num_paths
    )
    use_runtime(runtime, **wire)
    assert_ray_equals_engine(runtime, config, PROMPTS)


def test_paths_while_rows_join_with_chunked_prompts(runtime):
    """Continuous batching: prompt chunks go in (unforked) in the steps where other rows' paths fork."""
    config = engine_replace(CONFIG, max_batch_size=3, prefill_chunk_tokens=4, max_new_tokens=10, seed=7)
    use_runtime(runtime)
    assert_ray_equals_engine(runtime, config, JOINING_PROMPTS)


def test_paths_draft_nothing_ahead_under_overlap(runtime):
    """parallel.overlap drafts one path ahead; with K paths the step runs without it, unchanged."""
    if runtime.runtime.draft_in_shard:
        pytest.skip("a draft inside the shard refuses parallel.overlap (test_draft_in_shard.py)")
    config = engine_replace(CONFIG, max_batch_size=1, num_paths=2)
    use_runtime(runtime, overlap=True)
    assert_ray_equals_engine(runtime, config, PROMPTS[:2])
    assert runtime.timings.num_overlap_hits == 0


def test_paths_with_vocab_parallel_verification_are_refused_naming_the_keys(runtime):
    if runtime.runtime.draft_in_shard:
        pytest.skip("the draft inside the shard refuses vocab_parallel at TP = 2 itself (test_draft_in_shard.py)")
    use_runtime(runtime, verify="vocab_parallel")
    with pytest.raises(ConfigError, match=r"verifier\.num_paths=2.*parallel\.verify=gather"):
        runtime.scheduler()
