"""What a K-path step costs per target call, and the speedup that cost allows (issue 30's "why").

    python -m scripts.cost_multipath --grid docs/bench/multipath_grid/results.json --temperature 1

A multi-path step (engine/multipath_step.py) at B rows: the draft feeds each row's pending token
(B x 1), forks its cache K ways and runs g - 1 forwards of B*K x 1; the target forks its cache K
ways and scores [B*K, g + 1] in one forward; both keep one path's row (rollback, drop); the target's
logits over the K (g + 1) positions become probabilities and verify_paths decides. This script times
those pieces on the default pair (bf16 by default, as the grid) over a context as long as the grid's
(its prompts through the chat template, plus half the new tokens), taking turns with an
autoregressive step (the target's [B, 1] forward and its sampling), median of --repeats:
- target side: fork, forward, rollback, drop;
- draft side: the same on the draft, g - 1 forwards of B*K rows;
- verification: the draft's q and the target's p (logits_to_probs at --temperature) and
  verify_paths ("block"; "greedy" at T = 0) on logits of the target's vocabulary (random draft
  logits, target logits = draft logits + noise: a weak draft, as at T = 1, so the recursion visits
  many paths).
With c(K, g) = (the three) / autoregressive step, a policy of block efficiency BE can run at most
BE / c(K, g) times autoregressive's tokens/s: what is left over is sampling the drafts and the
scheduler's bookkeeping, which this does not time. The grid's results.json gives BE and the measured
speedup of each (K, g) (all prompts) beside it, and the BE a K-path policy would need to match
K = 1 at the same g: BE(K = 1) x c(K, g) / c(1, g).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from scripts.common import chat_ids, load_default_pair, markdown_table, read_bench_prompts

PATH_COUNTS = (1, 2, 4, 8)
DRAFT_LENS = (2, 3, 4)


def grid_context_tokens(tokenizer, records_per_task: int, max_new_tokens: int) -> int:
    """Mean prompt length of the grid's records (first records_per_task per task) + max_new_tokens / 2."""
    prompts = read_bench_prompts()
    lengths = []
    for task in sorted({prompt["task"] for prompt in prompts}):
        chosen = [prompt for prompt in prompts if prompt["task"] == task][:records_per_task]
        lengths += [len(chat_ids(tokenizer, prompt["messages"])) for prompt in chosen]
    return round(statistics.fmean(lengths) + max_new_tokens / 2)


def step_costs(
    target, draft, batch_size: int, context_tokens: int, repeats: int, temperature: float = 1.0
) -> dict:
    """Median seconds of the target side, draft side and verification of a (K, g) step, and of an
    autoregressive step.

    Returns {"autoregressive": s, "target": {(K, g): s}, "draft": {(K, g): s}, "verify": {(K, g): s}}.
    """
    from distributed_spec.engine.multipath_step import path_rows, verify_paths_from_logits
    from distributed_spec.engine.runner import ModelRunner
    from distributed_spec.verify import SamplingParams, logits_to_probs
    from distributed_spec.verify.sampling import sample_from_probs

    vocab = target.model.config.vocab_size
    # Any valid ids will do: a forward's cost does not depend on which tokens it reads.
    context = [1000 + index % (vocab - 1000) for index in range(context_tokens)]
    runners = {"target": ModelRunner(target.model), "draft": ModelRunner(draft.model)}
    for runner in runners.values():
        runner.prefill([context] * batch_size)
    rows = torch.arange(batch_size)
    nothing_kept = torch.zeros(batch_size, dtype=torch.long)

    def tokens(num_rows: int, n: int) -> torch.Tensor:
        return torch.tensor([context[:n]] * num_rows)

    params = SamplingParams(temperature=temperature)
    method = "greedy" if params.is_greedy else "block"  # as the engine verifies at T = 0
    generator = torch.Generator().manual_seed(0)
    u = torch.rand(batch_size, generator=generator, dtype=torch.float64)

    def autoregressive() -> None:
        logits = runners["target"].forward_tokens(tokens(batch_size, 1), num_logits=1)
        sample_from_probs(logits_to_probs(logits[:, -1], params), u)
        runners["target"].rollback(nothing_kept, 1)

    def target_side(num_paths: int, g: int) -> None:
        runner = runners["target"]
        runner.fork_rows(path_rows(batch_size, num_paths))
        runner.forward_tokens(tokens(batch_size * num_paths, g + 1))
        runner.rollback(torch.zeros(batch_size * num_paths, dtype=torch.long), g + 1)
        runner.drop_rows(rows * num_paths)

    def draft_side(num_paths: int, g: int) -> None:
        runner = runners["draft"]
        runner.forward_tokens(tokens(batch_size, 1), num_logits=1)
        runner.fork_rows(path_rows(batch_size, num_paths))
        for _ in range(g - 1):
            runner.forward_tokens(tokens(batch_size * num_paths, 1), num_logits=1)
        runner.rollback(torch.zeros(batch_size * num_paths, dtype=torch.long), g - 1)
        runner.drop_rows(rows * num_paths)
        runner.rollback(nothing_kept, 1)

    def verify_inputs(num_paths: int, g: int) -> tuple:
        """Logits in the models' dtype: the draft's [B, K, g, V], the target's [B, K, g + 1, V]."""
        dtype = next(target.model.parameters()).dtype
        shape = (batch_size, num_paths, g + 1, vocab)
        draft_logits = 2.0 * torch.randn(shape, generator=generator)
        target_logits = (draft_logits + 2.0 * torch.randn(shape, generator=generator)).to(dtype)
        draft_logits = draft_logits[:, :, :g].to(dtype)
        draft_probs = torch.softmax(draft_logits.float(), dim=-1).reshape(-1, vocab)
        draft_ids = torch.multinomial(draft_probs, 1, generator=generator).view(batch_size, num_paths, g)
        eta = torch.rand(batch_size, num_paths, g, generator=generator, dtype=torch.float64)
        return draft_logits, draft_ids, target_logits, torch.full((batch_size,), g), eta

    def verify(inputs: tuple) -> None:
        draft_logits, draft_ids, target_logits, num_drafts, eta = inputs
        draft_probs = logits_to_probs(draft_logits, params)
        verify_paths_from_logits(method, params, draft_ids, draft_probs, target_logits, num_drafts, eta, u)

    calls = {("autoregressive", 0, 0): autoregressive}
    for num_paths in PATH_COUNTS:
        for g in DRAFT_LENS:
            inputs = verify_inputs(num_paths, g)
            calls[("target", num_paths, g)] = lambda k=num_paths, g=g: target_side(k, g)
            calls[("draft", num_paths, g)] = lambda k=num_paths, g=g: draft_side(k, g)
            calls[("verify", num_paths, g)] = lambda inputs=inputs: verify(inputs)
    samples: dict[tuple, list[float]] = {key: [] for key in calls}
    with torch.no_grad():
        for repeat in range(repeats + 1):
            for key, call in calls.items():  # taking turns: the host's drift hits every piece alike
                start = time.perf_counter()
                call()
                if repeat:  # the first round warms up
                    samples[key].append(time.perf_counter() - start)
    median = {key: statistics.median(values) for key, values in samples.items()}
    cells = [(k, g) for k in PATH_COUNTS for g in DRAFT_LENS]
    return {
        "autoregressive": median[("autoregressive", 0, 0)],
        **{side: {cell: median[(side, *cell)] for cell in cells} for side in ("target", "draft", "verify")},
    }


def grid_rows(path: Path, temperature: float, batch_size: int) -> dict[tuple[int, int], dict]:
    """(K, g) -> the grid's all-prompts row (block_efficiency, speedup) for the draft model's policies."""
    rows = json.loads(path.read_text())["rows"]
    return {
        (row["num_paths"], row["g"]): row
        for row in rows
        if row["task"] == "all" and row["proposer"] == "model" and row["num_paths"] > 0
        and row["temperature"] == temperature and row["batch_size"] == batch_size
    }


def report(costs: dict, grid: dict[tuple[int, int], dict]) -> str:
    base = costs["autoregressive"]

    def cost(cell: tuple[int, int]) -> float:
        return sum(costs[side][cell] for side in ("target", "draft", "verify")) / base

    lines = []
    for cell in costs["target"]:
        num_paths, g = cell
        row, single = grid.get(cell), grid.get((1, g))
        be = row["block_efficiency"] if row else float("nan")
        needed = single["block_efficiency"] * cost(cell) / cost((1, g)) if single else float("nan")
        lines.append([
            num_paths, g, *(f"{costs[side][cell] / base:.2f}" for side in ("target", "draft", "verify")),
            f"{cost(cell):.2f}", f"{be:.3f}", f"{be / cost(cell):.2f}", f"{row['speedup']:.2f}" if row else "-",
            f"{needed:.3f}",
        ])  # fmt: skip
    columns = [
        "K", "g", "target side / AR", "draft side / AR", "verify / AR", "c(K, g)", "BE (grid)",
        "BE / c (bound on x AR)", "x AR (grid)", "BE to match K=1",
    ]  # fmt: skip
    return markdown_table(columns, lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", default="docs/bench/multipath_grid/results.json")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--records-per-task", type=int, default=4, help="as the grid was run")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="as the grid was run")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args(argv)

    target, draft = load_default_pair(dtype=args.dtype)
    context_tokens = grid_context_tokens(target.tokenizer, args.records_per_task, args.max_new_tokens)
    costs = step_costs(target, draft, args.batch_size, context_tokens, args.repeats, args.temperature)
    grid = grid_rows(Path(args.grid), args.temperature, args.batch_size)
    print(
        f"{args.dtype}, B = {args.batch_size}, context {context_tokens} tokens, {torch.get_num_threads()} threads; "
        f"autoregressive step {costs['autoregressive'] * 1e3:.1f} ms; BE and x AR: {args.grid} at T = {args.temperature:g}\n"
    )
    print(report(costs, grid))


if __name__ == "__main__":
    main()
