"""scripts/bench_distributed.py --bytes-only: the wire table is computed, nothing is run."""

from scripts.bench_distributed import bytes_table


def test_bytes_table_at_llama3_vocabulary():
    table = bytes_table([128_256], [64], g=4, top_k=64)
    # 64 x 4 x 128,256 q values at 4 and 2 bytes, plus the [64, 4] int64 draft ids.
    assert "| float32 (CPU default) | 128,256 | 64 | 4 | 131,336,192 |" in table
    assert "| bfloat16 (cuda default) | 128,256 | 64 | 4 | 65,669,120 |" in table
    assert "| greedy verification (no q) | 128,256 | 64 | 4 | 2,048 |" in table


def test_verify_table_compares_gather_and_vocab_parallel():
    from scripts.bench_distributed import verify_bytes_table

    table = verify_bytes_table([128_256], [64], g=4, tp_size=2, modes=["gather", "vocab_parallel"])
    # gather: each rank receives half of the [64, 5, 128,256] bf16 logits in the LM head's all-reduce.
    assert "| gather | bfloat16 q | 128,256 | 64 | 4 | 2 | 65,671,168 | 82,083,840 | 1,024 | 229.84 |" in table
    # vocab_parallel: no head all-reduce; q split by vocabulary (+ [64, 4] float32 row sums per shard).
    assert "| vocab_parallel | bfloat16 q | 128,256 | 64 | 4 | 2 | 65,673,216 | 0 | 10,752 | 65.69 |" in table


def test_vocab_parallel_runs_only_where_there_is_a_vocabulary_to_split():
    from distributed_spec.config import ParallelConfig
    from scripts.bench_distributed import ray_variants

    modes = ["gather", "vocab_parallel"]
    assert [label for label, _ in ray_variants(ParallelConfig(runtime="ray", device="cpu", backend="gloo", tp_size=1), modes)] == [
        "float32 q", "bfloat16 q", "bf16 q + overlap"
    ]
    vocab = [runtime for _, runtime in ray_variants(ParallelConfig(runtime="ray", device="cpu", backend="gloo", tp_size=2), ["vocab_parallel"])]
    assert len(vocab) == 2 and all(runtime.verify == "vocab_parallel" for runtime in vocab)


def test_bench_engine_warms_up_then_times_the_configured_run():
    """The engine half of the benchmark on a tiny pair: a short warm-up call, then the configured run
    (its config restored), and a row whose shares are of that run. The warm-up once replaced
    SamplingParams instead of the sampling config and the script failed before its first row."""
    from distributed_spec.engine import EngineConfig, SpeculativeEngine
    from distributed_spec.engine.config import SamplingConfig, VerifierConfig
    from distributed_spec.models.tiny import perturbed_copy, tiny_llama
    from scripts.bench_distributed import bench_engine

    target = tiny_llama(vocab_size=64, num_layers=2, hidden=32, seed=0, logit_scale=8.0)
    config = EngineConfig(
        verifier=VerifierConfig(method="block", num_draft_tokens=2),
        sampling=SamplingConfig(temperature=0.0, max_new_tokens=6),
        max_batch_size=2,
    )
    engine = SpeculativeEngine(target, perturbed_copy(target, noise=0.3, seed=1), config)
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    row, results = bench_engine(engine, prompts, batch_size=2)
    assert engine.config == config
    assert [len(result.token_ids) for result in results] == [6, 6]
    assert row.setup == "engine (1 process)" and row.batch_size == 2 and row.tokens_per_s > 0
    assert 0 < sum(row.shares.values()) <= 1.0 + 1e-6 and row.shares["transfer"] == 0.0
