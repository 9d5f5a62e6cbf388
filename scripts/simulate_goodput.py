"""goodput's choices against synthetic truths: no model, seconds of CPU, many seeds.

    python -m scripts.simulate_goodput                      # the default GoodputPolicy
    python -m scripts.simulate_goodput --optimism 1         # another optimistic prior
    python -m scripts.simulate_goodput --optimistic-positions 0   # the prior at every position
    python -m scripts.simulate_goodput --chain-ceiling      # position i lifted at position i-1's rate
    python -m scripts.simulate_goodput --diagnose           # what goodput believed when it chose each g
    python -m scripts.simulate_goodput --outliers 0.03 3    # 3% of the steps take 3x as long
    python -m scripts.simulate_goodput --row-shrinkage 1e9  # no per-row factor (each row at the global rates)

Each scenario is a cell of docs/RESULTS.md's grid (16e917b; `ray1 B1 T1` from 28c6254): the cost of
a g step over a g = 0 step and the block efficiency of fixed g, both read off that grid's fixed-g
jobs (cost = block efficiency / tokens-per-s ratio). A run of `--steps` steps at B rows draws each step's seconds from that cost
with lognormal noise (`noise`: ~15% per step in Ray, ~7% locally) and a slow drift (contexts grow),
and each row's kept length from the per-position rates the block efficiencies imply; the policy
sees only what the scheduler would show it. Printed per scenario: goodput's tokens/s over the
autoregressive run's of the same seed, divided by the best fixed policy's expected ratio (the
grid's goal reads >= 0.97), its 10th percentile and lowest over the seeds with the lowest run's
steps per g (a run that settled on a losing g shows there, not in the mean), and goodput's steps
per g summed over the seeds. --outliers P F makes a fraction P of the steps F times as long, as the
host's single slow steps are (a prompt joining, a slow spell), beside the lognormal noise. `rescue` is the local
B = 1, T = 1 cell after six unlucky rejections at start-up (tests/engine/test_goodput.py).

What it leaves out, so what a gap between it and the grid points to: prompts joining the batch,
the draft's catch-up, per-row budgets and Ray's per-call costs.
"""

from __future__ import annotations

import argparse
import math
import random

from distributed_spec.engine.goodput import AcceptanceEstimate, GoodputPolicy, RowAcceptance

# name: (B, T(g) / T(0) for g = 0..3, block efficiency of fixed g = 1..3, step noise, steps per run)
SCENARIOS = {
    "ray1 B4 T1": (4, (1.0, 1.38, 1.511, 1.579), (1.312, 1.401, 1.466), 0.15, 220),
    "ray1 B4 T0": (4, (1.0, 1.388, 1.492, 1.633), (1.34, 1.424, 1.489), 0.15, 220),
    "local B4 T0": (4, (1.0, 1.291, 1.416, 1.535), (1.34, 1.432, 1.483), 0.07, 220),
    "ray1 B1 T0": (1, (1.0, 1.291, 1.386, 1.44), (1.317, 1.459, 1.477), 0.15, 160),
    "local B1 T0": (1, (1.0, 1.201, 1.269, 1.349), (1.317, 1.459, 1.477), 0.07, 160),
    "local B1 T1": (1, (1.0, 1.227, 1.311, 1.415), (1.264, 1.447, 1.463), 0.07, 160),
    # The grid's ray1 row at 28c6254 (the draft inside the shard, docs/bench/throughput_grid_28c6254/ray1):
    # the one B = 1 cell where goodput reads below its best fixed g by more than 2%.
    "ray1 B1 T1": (1, (1.0, 1.177, 1.266, 1.403), (1.301, 1.414, 1.457), 0.15, 160),
}


def conditional_rates(block_efficiency: tuple[float, ...]) -> list[float]:
    """P(position i kept | position i - 1 kept) from fixed-g block efficiencies (1 + sum of a_i)."""
    marginals = [block_efficiency[0] - 1.0] + [
        max(later - earlier, 1e-3) for earlier, later in zip(block_efficiency, block_efficiency[1:])
    ]
    return [marginals[0]] + [min(marginals[i] / marginals[i - 1], 1.0) for i in range(1, len(marginals))]


def run(
    scenario: str,
    seed: int,
    policy_kw: dict,
    fixed: int | None = None,
    unlucky: int = 0,
    choices: list | None = None,
    outliers: tuple[float, float] = (0.0, 1.0),
    row_kw: dict | None = None,
) -> tuple[float, list[int]]:
    """One run: (tokens per second, steps per g). choices, if given, collects each exploiting step's
    (g, predicted T(B, g') / T(B, 0) for every g', expected tokens per row for every g') as the policy
    saw them when it chose (None for a g with no prediction yet). outliers: (fraction of the steps,
    factor on their seconds). row_kw: RowAcceptance's settings (shrinkage, decay) for every row."""
    num_rows, cost, block_efficiency, noise, num_steps = SCENARIOS[scenario]
    conditional = conditional_rates(block_efficiency)
    rng = random.Random(seed)
    policy = GoodputPolicy(max_draft_len=3, **policy_kw)
    records = [RowAcceptance(**(row_kw or {})) for _ in range(num_rows)]
    steps, tokens, seconds = [0] * 4, 0.0, 0.0
    for step in range(num_steps):
        rows = [(8, record) for record in records]
        g = fixed if fixed is not None else policy.choose_step(rows, num_rows)
        if choices is not None and fixed is None and not policy.measuring:
            seconds_by_g = [policy.cost.predict(num_rows, width) for width in range(4)]
            if seconds_by_g[0] is not None:
                choices.append((
                    g,
                    [None if seconds is None else seconds / seconds_by_g[0] for seconds in seconds_by_g],
                    [policy.expected_tokens(rows, width) / num_rows for width in range(4)],
                ))
        steps[g] += 1
        step_s = 0.05 * cost[g] * (1.0 + 0.15 * step / num_steps) * math.exp(rng.gauss(0.0, noise))
        if outliers[0] > 0 and rng.random() < outliers[0]:
            step_s *= outliers[1]
        accepted = []
        for _ in range(num_rows):
            kept = 0
            while kept < g and unlucky == 0 and rng.random() < conditional[kept]:
                kept += 1
            accepted.append(kept)
        unlucky = max(unlucky - g, 0)
        if fixed is None:
            for record, kept in zip(records, accepted):
                record.observe(kept, policy.predicted_accepted(g))
            policy.observe_acceptance([g] * num_rows, accepted)
            policy.observe_step(num_rows, g, step_s)
        tokens += sum(kept + 1 for kept in accepted)
        seconds += step_s
    return tokens / seconds, steps


def best_fixed(scenario: str) -> float:
    """The best fixed policy's expected tokens/s over autoregressive."""
    _, cost, block_efficiency, _, _ = SCENARIOS[scenario]
    return max([1.0] + [block_efficiency[g - 1] / cost[g] for g in (1, 2, 3)])


def chain_ceiling_rates(
    self: AcceptanceEstimate, optimism: float = 0.0, optimistic_positions: int | None = None
) -> list[float]:
    """AcceptanceEstimate.rates with the optimistic verdicts at position i kept at position i - 1's
    rate (1 at position 1) instead of always: the lift no longer grows with the block's length. At
    every position (optimistic_positions is not used)."""
    rates, previous = [], 0.5
    for verified, kept in zip(self.num_verified, self.num_kept):
        prior = 0.5 * previous if rates else previous
        ceiling = rates[-1] if rates else 1.0
        rate = (kept + self.prior_weight * prior + optimism * ceiling) / (verified + self.prior_weight + optimism)
        rates.append(min(rate, previous if rates else 1.0))
        previous = rates[-1]
    return rates


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--optimism", type=float, default=None, help="GoodputPolicy.optimism (default: its own)")
    parser.add_argument(
        "--optimistic-positions", type=int, default=None,
        help="GoodputPolicy.optimistic_positions (default: its own; 0 or less: every position)",
    )
    parser.add_argument("--chain-ceiling", action="store_true", help="lift position i at position i-1's rate")
    parser.add_argument(
        "--diagnose",
        action="store_true",
        help="per scenario and g chosen when exploiting: the mean predicted cost ratio and expected tokens",
    )
    parser.add_argument(
        "--outliers", type=float, nargs=2, default=(0.0, 1.0), metavar=("P", "F"),
        help="a fraction P of the steps takes F times as long",
    )
    parser.add_argument(
        "--row-shrinkage", type=float, default=None,
        help="RowAcceptance.shrinkage, pseudo-tokens pulling a row's factor to 1 (default: its own; 1e9: no row factor)",
    )
    parser.add_argument("--row-decay", type=float, default=None, help="RowAcceptance.decay per step (default: its own)")
    args = parser.parse_args(argv)
    outliers = tuple(args.outliers)
    row_kw = {
        name: value
        for name, value in (("shrinkage", args.row_shrinkage), ("decay", args.row_decay))
        if value is not None
    }
    policy_kw = {} if args.optimism is None else {"optimism": args.optimism}
    if args.optimistic_positions is not None:
        policy_kw["optimistic_positions"] = args.optimistic_positions if args.optimistic_positions > 0 else None
    if args.chain_ceiling:
        AcceptanceEstimate.rates = chain_ceiling_rates
    for scenario in SCENARIOS:
        runs, choices = [], []  # runs: (goodput / best, steps per g) per seed
        for seed in range(args.seeds):
            goodput, steps = run(scenario, seed, policy_kw, choices=choices, outliers=outliers, row_kw=row_kw)
            autoregressive, _ = run(scenario, seed + 1000, policy_kw, fixed=0, outliers=outliers, row_kw=row_kw)
            runs.append((goodput / autoregressive / best_fixed(scenario), steps))
        relative = [ratio for ratio, _ in runs]
        steps_per_g = [sum(column) for column in zip(*(steps for _, steps in runs))]
        lowest, lowest_steps = min(runs, key=lambda pair: pair[0])
        tenth = sorted(relative)[len(relative) // 10]
        print(
            f"{scenario:12s} goodput / best {sum(relative) / len(relative):.3f} (10th percentile {tenth:.3f}, "
            f"lowest {lowest:.3f} with steps per g {lowest_steps})   steps per g {steps_per_g}"
        )
        if args.diagnose:
            _, cost, block_efficiency, _, _ = SCENARIOS[scenario]
            print(f"    true cost ratios {list(cost)}, expected tokens {[1.0, *block_efficiency]}")
            for g in range(4):
                chosen = [(ratios, tokens) for width, ratios, tokens in choices if width == g]
                if chosen:
                    # Mean over the steps that had a prediction for that g (a g never measured has none).
                    known = [[r[w] for r, _ in chosen if r[w] is not None] for w in range(4)]
                    ratios = " ".join(f"{sum(k) / len(k):.3f}" if k else "-" for k in known)
                    tokens = " ".join(f"{sum(t[w] for _, t in chosen) / len(chosen):.3f}" for w in range(4))
                    print(
                        f"    chose g = {g} in {len(chosen)} exploiting steps: predicted cost ratios "
                        f"{ratios}, expected tokens {tokens}"
                    )
    rescued = [
        run("local B1 T1", seed, policy_kw, unlucky=6, outliers=outliers, row_kw=row_kw)[0]
        / run("local B1 T1", seed + 1000, policy_kw, fixed=0, outliers=outliers, row_kw=row_kw)[0]
        / best_fixed("local B1 T1")
        for seed in range(args.seeds)
    ]
    print(f"{'rescue':12s} goodput / best {sum(rescued) / len(rescued):.3f}")


if __name__ == "__main__":
    main()
