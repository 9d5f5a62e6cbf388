"""parallel.draft_in_shard: the draft inside target shard 0's actor (TP = 1 and 2), against the
single-process engine, token for token, on tiny random Llamas (one local Ray cluster).

    timeout 600 .venv/bin/python -m pytest tests/distributed/test_draft_in_shard.py -x -q

A step is one Ray call per shard (TargetShard.draft_and_verify): the draft applies its last verdict,
kept in the actor, proposes, rank 0 broadcasts the block's ids to the other ranks, and the group
verifies the block; q stays in rank 0's process. Every feature of the
separate draft actor that does not need a second process runs through it: greedy and sampled
verification, draft lengths, continuous batching with chunked prompts, goodput's probe steps and
n-gram rows, a relaunch after the actor dies.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import ray

from distributed_spec.config import ConfigError
from distributed_spec.distributed import RayCoordinator
from distributed_spec.verify import SamplingParams
from tests.configs import engine_replace
from tests.distributed.conftest import ray_config

# The tiny pair, prompts and configs of the separate draft actor's tests, so both runtimes are held
# to the same engine output.
from tests.distributed.test_runtime import (
    DRAFT,
    GREEDY,
    PROMPTS,
    TARGET,
    assert_continuous_batching_matches_each_prompt_alone,
    assert_goodput_probe_rows_replay_the_engine,
    assert_held_steps_are_capped_and_replayed,
    engine_results,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

RUNTIME = ray_config(num_cpus_per_shard=0.5, num_cpus_draft=0.5, draft_in_shard=True, step_timeout_s=60.0)


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def in_shard(ray_cluster, request):
    """A runtime with the draft inside shard 0, at TP = 1 and then at TP = 2."""
    coordinator = RayCoordinator(TARGET, DRAFT, GREEDY, replace(RUNTIME, tp_size=request.param)).start()
    yield coordinator
    coordinator.close()


def test_the_runtime_has_no_draft_actor_and_no_draft_bundle(in_shard):
    actors = in_shard.actors
    assert actors.draft is None and actors.draft_in_shard and actors.all_actors == actors.shards
    # One bundle per shard, 0.5 CPU each; at TP = 1 the shard's holds the draft's 0.5 CPU too (at
    # TP = 2 the ranks keep equal CPUs and threads: they meet at every all-reduce).
    tp_size = in_shard.runtime.tp_size
    bundles = ray.util.placement_group_table(actors.placement_group)["bundles"]
    assert bundles == {rank: {"CPU": 1.0 if tp_size == 1 else 0.5} for rank in range(tp_size)}


@pytest.mark.parametrize(
    ("method", "draft_length"),
    [
        ("block", {}),
        ("greedy", {}),
        ("token", {}),
        ("block", {"draft_len_schedule": "adaptive"}),
        ("block", {"draft_confidence_threshold": 0.3}),
    ],
)
def test_greedy_output_identical_to_engine(in_shard, method, draft_length):
    in_shard.config = engine_replace(GREEDY, method=method, **draft_length)
    results, stats = in_shard.generate_with_stats(PROMPTS)
    reference, reference_stats = engine_results(in_shard.config)
    assert [r.token_ids for r in results] == [r.token_ids for r in reference]
    assert [r.finish_reason for r in results] == [r.finish_reason for r in reference]
    assert stats.block_efficiency == pytest.approx(reference_stats.block_efficiency)
    assert stats.num_target_calls == reference_stats.num_target_calls
    # Every step drafted in shard 0's process: no block went over the wire.
    assert in_shard.timings.num_wire_bytes == 0
    assert in_shard.timings.num_iterations == stats.num_target_calls


@pytest.mark.parametrize("draft_length", [{}, {"draft_confidence_threshold": 0.3}])
def test_sampling_replays_the_engine_exactly(in_shard, draft_length):
    """Same seed, same order of uniforms: the same tokens as the engine, not just the same law."""
    in_shard.config = engine_replace(GREEDY, sampling=SamplingParams(temperature=1.0), seed=3, **draft_length)
    results = in_shard.generate(PROMPTS)
    reference, _ = engine_results(in_shard.config)
    assert [r.token_ids for r in results] == [r.token_ids for r in reference]


def test_continuous_batching_matches_the_engine_decoding_each_prompt_alone(in_shard):
    assert_continuous_batching_matches_each_prompt_alone(in_shard, "adaptive")


@pytest.mark.parametrize("proposer", ["model", "model+ngram"])
def test_goodput_plain_and_probe_steps_replay_the_engine_exactly(in_shard, scripted_goodput, proposer):
    stats = assert_goodput_probe_rows_replay_the_engine(in_shard, scripted_goodput, proposer)
    assert stats.num_steps_per_draft_len[0] >= 4
    # The g = 0 steps reached the draft inside the shard later, replayed before its next step.
    assert in_shard.timings.num_draft_steps_held >= 4


def test_held_steps_are_capped_and_replayed(in_shard, scripted_goodput, monkeypatch):
    assert_held_steps_are_capped_and_replayed(in_shard, scripted_goodput, monkeypatch)


def test_the_autoregressive_baseline_leaves_the_draft_idle(in_shard):
    in_shard.config = engine_replace(GREEDY, method="autoregressive")
    results = in_shard.generate(PROMPTS[:2])
    reference, _ = engine_results(in_shard.config, PROMPTS[:2])
    assert [r.token_ids for r in results] == [r.token_ids for r in reference]


def test_a_dead_shard_takes_its_draft_and_both_come_back_with_the_output_unchanged(in_shard):
    in_shard.config = engine_replace(GREEDY, sampling=SamplingParams(temperature=1.0), seed=5)
    killed: list = []

    def kill(iteration: int) -> None:
        if iteration == 3 and not killed:
            killed.append(in_shard.actors)
            ray.kill(in_shard.actors.shards[0], no_restart=True)

    in_shard.on_iteration = kill
    try:
        results = in_shard.generate(PROMPTS)
    finally:
        in_shard.on_iteration = None
    reference, _ = engine_results(in_shard.config)
    assert killed and in_shard.timings.num_restarts == 1
    assert [r.token_ids for r in results] == [r.token_ids for r in reference]
    assert in_shard.actors.draft_in_shard and in_shard.actors.draft is None
    assert in_shard.actors.rendezvous.master_port != killed[0].rendezvous.master_port


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"overlap": True}, "parallel.overlap=true drafts the next block while the shards verify"),
        (
            {"tp_size": 2, "verify": "vocab_parallel"},
            "parallel.draft_in_shard=true shares the drafted block's ids with the other shards",
        ),
    ],
)
def test_settings_a_draft_inside_the_shard_cannot_run_are_refused(changes, message):
    with pytest.raises(ConfigError, match=message):
        ray_config(draft_in_shard=True, **changes)
    # At TP = 1 there are no other shards to share q with: vocab_parallel is the plain verifier there.
    ray_config(draft_in_shard=True, verify="vocab_parallel")
