"""Block efficiency of multi-path block verification (verify/multipath.py) on synthetic p/q pairs.

    python -m scripts.bench_multipath_efficiency                     # K in {1,2,4,8}, g in {2,3,4}
    python -m scripts.bench_multipath_efficiency --mix 0.5 --rows 20000 --vocab 6

For every prefix of a small vocabulary, p ~ Dirichlet(concentration) and q = a p + (1 - a) w with
w ~ Dirichlet(concentration): the mixing weight a controls acceptance (sum_x min(p, q) >= a; the
table reports the realised mean). Each row draws 8 paths i.i.d. from q and every K verifies the
first K of them with the same uniforms (common random numbers: the K columns differ by the rule,
not by the draws). Block efficiency = E[tau + 1] per row, a Monte Carlo mean with its standard
error; tests/verify/oracle.py (multipath_block_efficiency) gives exact values for tiny cases.
This measures the rule only: what K paths cost the draft and the target is the engine's question.
A small vocabulary makes i.i.d. paths share prefixes (where later paths help) more often than a
model's vocabulary would, unless its drafts are as peaked; read the K columns as an upper range.
"""

from __future__ import annotations

import argparse
import itertools
import math

import torch

from distributed_spec.verify.multipath import MultiPathUniforms, draw_multipath_uniforms, verify_multipath
from tests.verify import oracle
from tests.verify.batched import dense_table, sample_block_inputs

PATH_COUNTS = (1, 2, 4, 8)


def synthetic_pair(
    vocab_size: int, mix: float, concentration: float, seed: int
) -> tuple[oracle.Table, oracle.Table]:
    """Context-dependent p and q = mix p + (1 - mix) w, as oracle tables (prefix -> distribution)."""
    p = oracle.RandomTable(vocab_size, seed=2 * seed, concentration=concentration)
    w = oracle.RandomTable(vocab_size, seed=2 * seed + 1, concentration=concentration)

    def q(prefix: tuple[int, ...]) -> list[float]:
        return [mix * a + (1.0 - mix) * b for a, b in zip(p(prefix), w(prefix))]

    return p, q


def token_acceptance(p_dense: torch.Tensor, q_dense: torch.Tensor) -> float:
    """Mean over prefixes of sum_x min(p, q): the pair's token-level acceptance (design section 2)."""
    return torch.minimum(p_dense, q_dense).sum(dim=-1).mean().item()


def block_efficiencies(
    p_dense: torch.Tensor,
    q_dense: torch.Tensor,
    g: int,
    path_counts: tuple[int, ...],
    num_rows: int,
    generator: torch.Generator,
) -> dict[int, tuple[float, float]]:
    """{K: (mean of tau + 1, its standard error)}, K paths drawn i.i.d. from q, shared across K.

    p_dense, q_dense: [sum_{i<=g} V^i, V] tables of every prefix (tests/verify/batched.dense_table).
    """
    most = max(path_counts)
    blocks = [sample_block_inputs(p_dense, q_dense, num_rows, g, generator) for _ in range(most)]
    draft_ids, draft_probs, target_probs = (torch.stack(parts, dim=1) for parts in zip(*blocks))
    uniforms = draw_multipath_uniforms(num_rows, most, g, generator)
    n = torch.full((num_rows,), g)
    result = {}
    for k in path_counts:
        output = verify_multipath(
            draft_ids[:, :k],
            draft_probs[:, :k],
            target_probs[:, :k],
            n,
            MultiPathUniforms(uniforms.eta[:, :k], uniforms.u),
        )
        tokens = output.accepted_counts.double() + 1.0
        result[k] = (tokens.mean().item(), tokens.std().item() / math.sqrt(num_rows))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab", type=int, default=8)
    parser.add_argument("--num-draft-tokens", "--gamma", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--paths", type=int, nargs="+", default=list(PATH_COUNTS))
    parser.add_argument("--mix", type=float, nargs="+", default=[0.3, 0.6, 0.9])
    parser.add_argument("--concentration", type=float, default=0.5)
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path_counts = tuple(sorted(set(args.paths)))
    print(
        f"V = {args.vocab}, Dirichlet({args.concentration}) per prefix, {args.rows} rows per cell, seed "
        f"{args.seed}; block efficiency E[tau + 1] +- standard error; ratio = best K over K = 1\n"
    )
    print("| a | acceptance | g | " + " | ".join(f"K = {k}" for k in path_counts) + " | ratio |")
    print("|---|---|---|" + "---|" * len(path_counts) + "---|")
    for mix, g in itertools.product(args.mix, args.num_draft_tokens):
        p, q = synthetic_pair(args.vocab, mix, args.concentration, args.seed)
        p_dense, q_dense = (dense_table(table, (), args.vocab, g) for table in (p, q))
        generator = torch.Generator().manual_seed(args.seed)
        cells = block_efficiencies(p_dense, q_dense, g, path_counts, args.rows, generator)
        ratio = max(mean for mean, _ in cells.values()) / cells[path_counts[0]][0]
        row = " | ".join(f"{mean:.3f} +- {se:.3f}" for mean, se in cells.values())
        print(
            f"| {mix} | {token_acceptance(p_dense, q_dense):.3f} | {g} | {row} | {ratio:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
