"""scripts/bench_verify.py: the torch implementation on a tiny grid, and the side-by-side table."""

from scripts import bench_verify


def test_torch_table_on_a_tiny_grid():
    text = bench_verify.main(["--impl", "torch", "--batch-sizes", "1", "--num-draft-tokens", "2", "--vocab-sizes", "32",
                              "--iters", "1"])
    assert "| B | g | V | token | block | greedy | block/token | token (from logits) |" in text
    assert text.count("\n| 1 | 2 | 32 |") == 1


def test_old_flag_names_and_per_impl_defaults():
    args = bench_verify.parse_args(["--batch", "1", "--num-draft-tokens", "4", "--vocab", "64", "--repeats", "3"])
    assert (args.batch_sizes, args.num_draft_tokens, args.vocab_sizes, args.iters) == ([1], [4], [64], 3)
    parallel = bench_verify.settings(bench_verify.parse_args(["--impl", "vocab_parallel"]), "vocab_parallel")
    assert parallel.batch_sizes == [1, 32, 128] and parallel.methods == ["block"] and parallel.iters == 5


def test_side_by_side_only_where_two_implementations_measured():
    torch_cells = {("block", 1, 4, 64): {"torch (min)": 0.002}, ("token", 1, 4, 64): {"torch (min)": 0.001}}
    fused_cells = {("block", 1, 4, 64): {"triton fused (median)": 0.0005}}
    table = bench_verify.side_by_side([torch_cells, fused_cells])
    assert "| block | 1 | 4 | 64 | 2.000 | 0.500 |" in table and "| token |" not in table
    assert bench_verify.side_by_side([torch_cells, {}]) is None
