"""scripts/bench_distributed.py --bytes-only: the wire table is computed, nothing is run."""

from scripts.bench_distributed import bytes_table


def test_bytes_table_at_llama3_vocabulary():
    table = bytes_table([128_256], [64], g=4, top_k=64)
    # 64 x 4 x 128,256 q values at 4 and 2 bytes, plus the [64, 4] int64 draft ids.
    assert "| float32 (CPU default) | 128,256 | 64 | 4 | 131,336,192 |" in table
    assert "| bfloat16 (cuda default) | 128,256 | 64 | 4 | 65,669,120 |" in table
    assert "| greedy verification (no q) | 128,256 | 64 | 4 | 2,048 |" in table
