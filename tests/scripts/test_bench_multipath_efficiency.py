"""scripts/bench_multipath_efficiency.py: its Monte Carlo block efficiency against the exact oracle."""

from __future__ import annotations

import sys

import torch

from scripts import bench_multipath_efficiency as bench
from tests.verify import oracle
from tests.verify.batched import dense_table


def test_monte_carlo_efficiency_matches_the_exact_value():
    vocab_size, g, num_rows = 3, 2, 20_000
    p, q = bench.synthetic_pair(vocab_size, mix=0.5, concentration=0.5, seed=3)
    p_dense, q_dense = (dense_table(table, (), vocab_size, g) for table in (p, q))
    cells = bench.block_efficiencies(
        p_dense, q_dense, g, (1, 2), num_rows, torch.Generator().manual_seed(0)
    )
    for k, (mean, standard_error) in cells.items():
        exact = oracle.multipath_block_efficiency(p, [q] * k, (), g)
        assert abs(mean - exact) < 4 * standard_error, (k, mean, exact)
    assert cells[2][0] > cells[1][0]


def test_main_prints_one_row_per_cell(monkeypatch, capsys):
    argv = ["bench", "--vocab", "3", "--num-draft-tokens", "1", "2", "--paths", "1", "2", "--mix", "0.5", "--rows", "50"]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 0.5 |")]
    assert len(rows) == 2
