"""The Ray runtime against the single-process engine, on tiny random Llamas (one local Ray cluster).

    timeout 600 .venv/bin/python -m pytest tests/distributed/test_runtime.py -x -q

Order matters for cost only: the TP = 2 runtime is launched once and reused; the fault tests
restart it in place; the last test tears it down through Ctrl-C.
"""

from __future__ import annotations

import glob
import math
import time
from dataclasses import replace

import pytest
import ray
import torch
from ray.util.placement_group import placement_group_table

from distributed_spec.config import ConfigError
from distributed_spec.distributed import GroupFailure, RayCoordinator
from distributed_spec.distributed import coordinator as coordinator_module
from distributed_spec.distributed.factories import TinyLlamaFactory
from distributed_spec.engine import EngineConfig, SpeculativeEngine
from distributed_spec.engine.config import SamplingConfig, VerifierConfig
from distributed_spec.verify import SamplingParams
from tests.configs import engine_replace
from tests.distributed.conftest import ray_config

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

VOCAB_SIZE = 64
# Peaky enough that the draft's guess of a bonus token is sometimes right (overlap hits), noisy
# enough that blocks are often rejected part-way: sum_x min(p, q) is about 0.8 at temperature 1.
TARGET = TinyLlamaFactory(vocab_size=VOCAB_SIZE, num_layers=2, hidden=32, seed=0, logit_scale=16.0)
DRAFT = TinyLlamaFactory(vocab_size=VOCAB_SIZE, num_layers=2, hidden=32, seed=0, logit_scale=16.0, noise=0.2)
PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16], [3], [20, 21, 22]]
GREEDY = EngineConfig(
    verifier=VerifierConfig(method="block", num_draft_tokens=4),
    sampling=SamplingConfig(temperature=0.0, max_new_tokens=24),
    max_batch_size=4,
)
# Sampled, with prompts that repeat themselves (n-gram matches) and prompts fed in chunks.
SAMPLED_REPEATS = engine_replace(
    GREEDY, sampling=SamplingParams(temperature=0.5), seed=9, max_batch_size=3, prefill_chunk_tokens=3
)
REPEATING_PROMPTS = PROMPTS + [[4, 5, 4, 5, 4], [7, 8, 9, 7, 8]]
# Fractional CPUs: 2 shards + draft fit in the test cluster's 4 logical CPUs twice over.
RUNTIME = ray_config(tp_size=2, num_cpus_per_shard=0.5, num_cpus_draft=0.5, step_timeout_s=60.0)


def engine_results(config: EngineConfig, prompts=PROMPTS):
    draft = DRAFT() if config.verifier.uses_draft_model else None
    return SpeculativeEngine(TARGET(), draft, config).generate_with_stats(prompts)


@pytest.fixture(scope="module")
def tp2(ray_cluster):
    coordinator = RayCoordinator(TARGET, DRAFT, GREEDY, RUNTIME).start()
    yield coordinator
    coordinator.close()


def _actor_is_dead(actor) -> bool:
    try:
        ray.get(actor.pid.remote(), timeout=30)
    except ray.exceptions.RayActorError:
        return True
    return False


def test_tp2_logits_equal_tp1_logits(tp2):
    input_ids = torch.randint(0, VOCAB_SIZE, (3, 12), generator=torch.Generator().manual_seed(1))
    config = engine_replace(GREEDY, method="autoregressive")
    with RayCoordinator(TARGET, None, config, replace(RUNTIME, tp_size=1)) as tp1:
        (tp1_logits,) = ray.get([shard.logits.remote(input_ids) for shard in tp1.actors.shards])
        # While TP = 1 is up: the autoregressive baseline matches the engine's.
        results = tp1.generate(PROMPTS[:2])
        # ... and so do n-gram blocks, with no draft actor at all.
        assert tp1.actors.draft is None
        tp1.config = engine_replace(GREEDY, proposer="ngram")
        ngram_results = tp1.generate(PROMPTS[:2])
    tp2_logits = ray.get([shard.logits.remote(input_ids) for shard in tp2.actors.shards])
    local_logits = TARGET()(input_ids=input_ids).logits.detach()
    assert tp1_logits.shape == (3, 12, VOCAB_SIZE)
    for rank_logits in tp2_logits:
        assert (rank_logits - tp1_logits).abs().max() < 1e-4
    assert (tp1_logits - local_logits).abs().max() < 1e-4
    reference, _ = engine_results(config, PROMPTS[:2])
    assert [r.token_ids for r in results] == [r.token_ids for r in reference]
    assert [r.token_ids for r in ngram_results] == [r.token_ids for r in reference]


ADAPTIVE = {"draft_len_schedule": "adaptive"}
CONFIDENCE_STOP = {"draft_confidence_threshold": 0.3}


@pytest.mark.parametrize(
    ("method", "wire_dtype", "wire_top_k", "overlap", "draft_length"),
    [
        ("block", "float32", 0, False, {}),
        ("greedy", "float32", 0, False, {}),
        ("block", "bfloat16", 0, True, {}),
        ("token", "float16", 8, True, {}),
        ("block", "float32", 0, False, ADAPTIVE),
        ("block", "bfloat16", 0, True, ADAPTIVE),
        ("block", "float32", 0, False, CONFIDENCE_STOP),
        ("token", "bfloat16", 0, True, {**ADAPTIVE, **CONFIDENCE_STOP}),
    ],
)
def test_greedy_output_identical_to_engine(tp2, method, wire_dtype, wire_top_k, overlap, draft_length):
    tp2.config = engine_replace(GREEDY, method=method, **draft_length)
    tp2.runtime = replace(RUNTIME, wire_dtype=wire_dtype, wire_top_k=wire_top_k, overlap=overlap)
    results, stats = tp2.generate_with_stats(PROMPTS)
    reference, reference_stats = engine_results(tp2.config)
    assert [r.token_ids for r in results] == [r.token_ids for r in reference]
    assert [r.finish_reason for r in results] == [r.finish_reason for r in reference]
    assert all(len(r.token_ids) == GREEDY.sampling.max_new_tokens for r in results)
    if method != "greedy":
        # Temperature 0: q_i travels as a (1, X_i) pair, not V floats (ids 8 + pair 8 bytes a token).
        assert 0 < tp2.timings.num_wire_bytes <= tp2.timings.num_iterations * 4 * 4 * (8 + 4 + 4)
    if overlap:
        # One row: the block drafted ahead is used whenever its block and bonus guess were right
        # (under "adaptive", only if it was drafted at the next step's longer g).
        single = tp2.generate(PROMPTS[:1])
        assert single[0].token_ids == reference[0].token_ids
        assert tp2.timings.num_overlap_hits > 0
    else:
        assert stats.block_efficiency == pytest.approx(reference_stats.block_efficiency)
        assert stats.num_target_calls == reference_stats.num_target_calls


@pytest.mark.parametrize("draft_length", [{}, ADAPTIVE, {"draft_confidence_threshold": 0.3}])
def test_sampling_replays_the_engine_exactly_without_overlap(tp2, draft_length):
    """Same seed, same order of uniforms: the same tokens as the engine, not just the same law."""
    tp2.config = engine_replace(GREEDY, sampling=SamplingParams(temperature=1.0), seed=3, **draft_length)
    tp2.runtime = RUNTIME
    results = tp2.generate(PROMPTS)
    reference, _ = engine_results(tp2.config)
    assert [r.token_ids for r in results] == [r.token_ids for r in reference]


def assert_continuous_batching_matches_each_prompt_alone(coordinator, draft_len_schedule: str) -> None:
    """Ray with 3 rows at a time, long prompts chunked, gives each prompt the tokens the
    single-process engine gives it alone (sampled)."""
    prompts = [[(3 * i + j) % VOCAB_SIZE for j in range(1 + (5 * i) % 11)] for i in range(10)]
    config = engine_replace(
        GREEDY,
        sampling=SamplingParams(temperature=1.0),
        max_new_tokens=12,
        max_batch_size=3,
        prefill_chunk_tokens=4,
        draft_len_schedule=draft_len_schedule,
        max_draft_len=6,
        seed=7,
    )
    coordinator.config = config
    results = coordinator.generate(prompts)
    alone, _ = engine_results(
        engine_replace(config, max_batch_size=1, scheduling=replace(config.scheduling, prefill_chunk_tokens=None)),
        prompts,
    )
    assert [r.token_ids for r in results] == [r.token_ids for r in alone]


@pytest.mark.parametrize("draft_len_schedule", ["constant", "adaptive"])
def test_continuous_batching_matches_the_engine_decoding_each_prompt_alone(tp2, draft_len_schedule):
    """Per-row random streams: a record's tokens do not depend on the rows it shares a batch with."""
    tp2.runtime = RUNTIME
    assert_continuous_batching_matches_each_prompt_alone(tp2, draft_len_schedule)


def test_goodput_greedy_output_identical_to_engine(tp2):
    tp2.config = engine_replace(GREEDY, draft_len_schedule="goodput", max_draft_len=4)
    tp2.runtime = RUNTIME
    results, stats = tp2.generate_with_stats(PROMPTS)
    reference, _ = engine_results(engine_replace(GREEDY, method="autoregressive"))
    assert [r.token_ids for r in results] == [r.token_ids for r in reference]
    assert sum(stats.num_steps_per_draft_len) == stats.num_target_calls


def assert_goodput_probe_rows_replay_the_engine(coordinator, scripted_goodput, proposer: str):
    """Plain steps, measurement steps that draft for one row (the others verify no draft and the draft
    leaves them unfed, prompts still staged included), n-gram rows under the draft's: sampled output
    equal to the engine's. Returns the run's stats."""
    pattern = [(0, True)] * 2 + [(2, True)] * 3 + [(0, False)] * 2 + [(3, True)] * 2 + [(2, False)] * 200
    scripted_goodput(pattern, probe_rows=1)
    coordinator.config = engine_replace(
        SAMPLED_REPEATS, proposer=proposer, draft_len_schedule="goodput", max_draft_len=3, max_batch_size=4
    )
    results, stats = coordinator.generate_with_stats(REPEATING_PROMPTS)
    reference, _ = engine_results(coordinator.config, REPEATING_PROMPTS)
    assert [r.token_ids for r in results] == [r.token_ids for r in reference]
    return stats


def assert_held_steps_are_capped_and_replayed(coordinator, scripted_goodput, monkeypatch) -> None:
    """Runs of plain steps longer than MAX_HELD_DRAFT_STEPS (2 here): the coordinator never holds
    more; the step past the cap goes to the draft, which replays the held ones; sampled output equal
    to the engine's."""
    monkeypatch.setattr(coordinator_module, "MAX_HELD_DRAFT_STEPS", 2)
    scripted_goodput([(0, False)] * 7 + [(2, False)] * 2 + [(0, False)] * 5 + [(1, False)] * 200)
    coordinator.config = engine_replace(
        SAMPLED_REPEATS, draft_len_schedule="goodput", max_draft_len=3, max_batch_size=4
    )
    num_held: list[int] = []
    coordinator.on_iteration = lambda iteration: num_held.append(len(coordinator._held_draft_steps))
    try:
        results = coordinator.generate(REPEATING_PROMPTS)
    finally:
        coordinator.on_iteration = None
    reference, _ = engine_results(coordinator.config, REPEATING_PROMPTS)
    assert [r.token_ids for r in results] == [r.token_ids for r in reference]
    assert max(num_held) == 2 and num_held[:3] == [1, 2, 0]


@pytest.mark.parametrize("proposer", ["model", "model+ngram"])
def test_goodput_probe_rows_replay_the_engine_exactly(tp2, scripted_goodput, proposer):
    tp2.runtime = RUNTIME
    assert_goodput_probe_rows_replay_the_engine(tp2, scripted_goodput, proposer)
    # The g = 0 steps reached the draft actor later, in one replay call each run of them.
    assert tp2.timings.num_draft_steps_held >= 4


def test_ngram_steps_leave_the_draft_actor_idle(tp2, scripted_goodput, monkeypatch):
    """Under goodput a step of n-gram blocks alone is held back like a g = 0 step (no call to the
    draft actor, no catch-up for a next step that is one too), and a step the model drafts in tells
    goodput its draft's own seconds (what an n-gram step of that g skips). Sampled output equals the
    engine's."""
    from distributed_spec.engine.goodput import GoodputPolicy

    tp2.runtime = RUNTIME
    scripted_goodput([(2, False, False)] * 6 + [(2, False, True)] * 2 + [(2, False, False)] * 6 + [(2, False, True)] * 200)
    monkeypatch.setattr(GoodputPolicy, "ngram_rows", lambda self, rows, g: [row.max_ngram > 0 for row in rows])
    told = []
    observe_step = GoodputPolicy.observe_step

    def recording(self, num_rows, g, seconds, num_prompt_slots=0, model=True, draft_seconds=None):
        told.append((g, model, draft_seconds))
        return observe_step(self, num_rows, g, seconds, num_prompt_slots, model, draft_seconds)

    monkeypatch.setattr(GoodputPolicy, "observe_step", recording)
    tp2.config = engine_replace(
        SAMPLED_REPEATS, proposer="model+ngram", draft_len_schedule="goodput", max_draft_len=3, max_batch_size=4
    )
    results = tp2.generate(REPEATING_PROMPTS)
    num_told_in_ray = len(told)
    reference, _ = engine_results(tp2.config, REPEATING_PROMPTS)
    assert [r.token_ids for r in results] == [r.token_ids for r in reference]
    # Both runs of n-gram steps were held: none reached the draft actor on its own.
    assert tp2.timings.num_draft_steps_held >= 12
    ray_told = told[:num_told_in_ray]
    assert all(draft_seconds > 0 for g, model, draft_seconds in ray_told if model and g > 0)
    assert all(draft_seconds == 0 for g, model, draft_seconds in ray_told if not model)


def test_held_steps_are_capped_and_replayed(tp2, scripted_goodput, monkeypatch):
    tp2.runtime = RUNTIME
    assert_held_steps_are_capped_and_replayed(tp2, scripted_goodput, monkeypatch)


@pytest.mark.parametrize(
    ("proposer", "wire_dtype", "wire_top_k", "overlap", "draft_length"),
    [
        ("ngram", "float32", 0, False, {}),
        ("model+ngram", "float32", 0, False, {}),
        ("model+ngram", "bfloat16", 8, True, ADAPTIVE),
        ("ngram", "bfloat16", 0, False, {"draft_len_schedule": "goodput"}),
    ],
)
def test_ngram_proposers_greedy_output_identical_to_engine(
    tp2, steady_steps, proposer, wire_dtype, wire_top_k, overlap, draft_length
):
    """n-gram blocks built on the driver (ngram) or laid into the draft actor's block (model+ngram)."""
    tp2.config = engine_replace(GREEDY, proposer=proposer, **draft_length)
    tp2.runtime = replace(RUNTIME, wire_dtype=wire_dtype, wire_top_k=wire_top_k, overlap=overlap)
    results, stats = tp2.generate_with_stats(PROMPTS)
    autoregressive, _ = engine_results(engine_replace(GREEDY, method="autoregressive"))
    assert [r.token_ids for r in results] == [r.token_ids for r in autoregressive]
    assert stats.extra["proposer/rows_ngram"] > 0 and stats.extra["proposer/accepted_ngram"] > 0
    if proposer == "model+ngram":
        assert stats.extra["proposer/rows_model"] > 0
    if draft_length.get("draft_len_schedule") != "goodput":
        _, reference_stats = engine_results(tp2.config)
        counts = {name: value for name, value in stats.extra.items() if name.startswith("proposer/")}
        assert counts == {
            name: value for name, value in reference_stats.extra.items() if name.startswith("proposer/")
        }


@pytest.mark.parametrize("proposer", ["ngram", "model+ngram"])
def test_ngram_proposers_sampling_replays_the_engine_exactly(tp2, proposer):
    """Same seed: the same tokens as the engine (point-mass q on the wire, the draft's cache in step)."""
    tp2.config = engine_replace(SAMPLED_REPEATS, proposer=proposer)
    tp2.runtime = RUNTIME
    results, stats = tp2.generate_with_stats(REPEATING_PROMPTS)
    reference, _ = engine_results(tp2.config, REPEATING_PROMPTS)
    assert [r.token_ids for r in results] == [r.token_ids for r in reference]
    assert stats.extra["proposer/accepted_ngram"] > 0


def test_sampling_block_efficiency_matches_engine(tp2):
    """Overlap and bf16 q change the random streams, not the distribution of accepted lengths."""
    prompts = [[(7 * i + j) % VOCAB_SIZE for j in range(1 + i % 3)] for i in range(24)]
    config = engine_replace(
        GREEDY, sampling=SamplingParams(temperature=1.0), max_new_tokens=64, max_batch_size=8, seed=11
    )
    tp2.config = config
    tp2.runtime = replace(RUNTIME, wire_dtype="bfloat16", overlap=True)
    results, stats = tp2.generate_with_stats(prompts)
    reference, reference_stats = engine_results(
        engine_replace(config, sampling=replace(config.sampling, seed=12)), prompts
    )

    def mean_and_standard_error(rows):
        # Per-row mean accepted length, weighted by iterations; the standard error over rows.
        taus = [row.stats.num_accepted / row.stats.num_iterations for row in rows]
        mean = sum(taus) / len(taus)
        variance = sum((tau - mean) ** 2 for tau in taus) / (len(taus) - 1)
        return mean, math.sqrt(variance / len(taus))

    ray_mean, ray_error = mean_and_standard_error(results)
    engine_mean, engine_error = mean_and_standard_error(reference)
    assert stats.num_row_iterations > 300 and reference_stats.num_row_iterations > 300
    assert 0.3 < engine_mean < 3.7, (
        "the pair must accept some but not all drafts for the test to mean anything"
    )
    assert abs(ray_mean - engine_mean) < 4 * math.hypot(ray_error, engine_error)


def test_sampling_with_blocks_drafted_ahead(tp2):
    """One row at a time, so blocks drafted ahead get used while sampling (the hit path)."""
    config = engine_replace(
        GREEDY, sampling=SamplingParams(temperature=0.3), max_new_tokens=48, max_batch_size=1, seed=5
    )
    tp2.config = config
    tp2.runtime = replace(RUNTIME, overlap=True, wire_dtype="bfloat16")
    results, stats = tp2.generate_with_stats(PROMPTS[:3])
    assert tp2.timings.num_overlap_hits > 0
    assert all(len(r.token_ids) == 48 and r.finish_reason == "length" for r in results)
    assert 1.0 <= stats.block_efficiency <= config.verifier.num_draft_tokens + 1


def test_dead_shard_and_dead_draft_are_replaced_and_output_unchanged(tp2):
    """Kill target shard 1 at iteration 3, then the draft at iteration 9 (of the new runtime)."""
    tp2.config = GREEDY
    tp2.runtime = replace(RUNTIME, overlap=True)
    runtimes = []
    killed_at: list[float] = []
    detected_at: list[float] = []
    restart = tp2._restart

    def kill(iteration: int) -> None:
        if iteration in (3, 9) and len(runtimes) < 2 and tp2.timings.num_restarts == len(runtimes):
            runtimes.append(tp2.actors)
            ray.kill(tp2.actors.shards[1] if iteration == 3 else tp2.actors.draft, no_restart=True)
            killed_at.append(time.perf_counter())

    def record_restart(error: BaseException) -> None:
        detected_at.append(time.perf_counter())
        restart(error)

    tp2.on_iteration = kill
    tp2._restart = record_restart
    try:
        results = tp2.generate(PROMPTS)
    finally:
        tp2.on_iteration = None
        del tp2._restart
    reference, _ = engine_results(GREEDY)
    assert len(killed_at) == 2 and tp2.timings.num_restarts == 2
    assert [r.token_ids for r in results] == [r.token_ids for r in reference]
    assert all(r.finish_reason == "length" for r in results)
    # Noticed within seconds (RayActorError from ray.wait), not after parallel.step_timeout_s.
    assert all(detected - killed < 5.0 for killed, detected in zip(killed_at, detected_at))
    ports = {runtime.rendezvous.master_port for runtime in runtimes} | {tp2.actors.rendezvous.master_port}
    assert len(ports) == 3
    for old in runtimes:
        assert all(_actor_is_dead(actor) for actor in old.all_actors)
        assert placement_group_table(old.placement_group)["state"] == "REMOVED"
        assert not glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_*_{old.rendezvous.master_port}_*")


def test_too_many_failures_raise(tp2):
    tp2.runtime = replace(RUNTIME, max_restarts=0)
    tp2.on_iteration = lambda iteration: ray.kill(tp2.actors.shards[0], no_restart=True)
    try:
        with pytest.raises(GroupFailure, match="parallel.max_restarts"):
            tp2.generate(PROMPTS[:1])
    finally:
        tp2.on_iteration = None
        tp2.runtime = RUNTIME


def test_a_pair_the_actors_cannot_decode_is_refused_at_launch_naming_the_keys(ray_cluster):
    """The group checks what the actors loaded with models.check_pair, as the engine does."""
    runtime = replace(RUNTIME, tp_size=1)
    for draft, max_context_len, message in (
        (replace(DRAFT, vocab_size=48), None, r"vocabulary size 48 but target .* has 64.*model\.draft\.source"),
        (DRAFT, 300, r"model\.max_context_len=300 exceeds the 256 positions"),
    ):
        coordinator = RayCoordinator(TARGET, draft, GREEDY, runtime, max_context_len=max_context_len)
        with pytest.raises(ConfigError, match=message):
            coordinator.start()
        assert coordinator.actors is None
        coordinator.close()
    coordinator = RayCoordinator(TARGET, DRAFT, GREEDY, runtime, max_context_len=100)
    try:
        assert coordinator.max_context == 100
    finally:
        coordinator.close()


def test_a_load_past_its_timeout_says_which_setting_and_leaves_nothing(ray_cluster):
    def slow_target():
        time.sleep(120)
        return TARGET()

    def live_groups() -> set[str]:
        return {key for key, entry in placement_group_table().items() if entry["state"] != "REMOVED"}

    before = live_groups()  # the module's TP = 2 runtime may be up
    config = engine_replace(GREEDY, method="autoregressive")
    coordinator = RayCoordinator(slow_target, None, config, replace(RUNTIME, tp_size=1, load_timeout_s=10.0))
    with pytest.raises(TimeoutError, match="parallel.load_timeout_s = 10 s"):
        coordinator.start()
    assert coordinator.actors is None
    assert live_groups() == before


def test_ctrl_c_leaves_no_actor_and_no_placement_group(tp2):
    tp2.config = GREEDY
    actors = tp2.start().actors

    def interrupt(iteration: int) -> None:
        raise KeyboardInterrupt

    tp2.on_iteration = interrupt
    with pytest.raises(KeyboardInterrupt), tp2:
        tp2.generate(PROMPTS)
    assert tp2.actors is None
    assert all(_actor_is_dead(actor) for actor in actors.all_actors)
    assert placement_group_table(actors.placement_group)["state"] == "REMOVED"
    assert not glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_*_{actors.rendezvous.master_port}_*")
