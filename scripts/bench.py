"""Side-by-side benchmark: our engine (autoregressive, token, block, greedy) vs Hugging Face assisted
generation, same models, prompts and seeds, in one run.

    python -m scripts.bench                                   # the full grid (hours on 2 CPU cores)
    python -m scripts.bench --num-prompts 12 --max-new-tokens 32 --seeds 0 --out docs/bench
    python -m scripts.bench --dtype bfloat16 ...              # both models' weights in bf16
    python -m scripts.bench --costs-only --dtype float32      # the forward-cost table alone (seconds)
    python -m scripts.bench --engine-table                    # the engine's methods at batch 8 (below)
    python -m scripts.bench --engine-table --draft truncated --num-layers 8 --temperatures 0 --methods greedy

Default pair: SmolLM2-135M-Instruct target with the bundled distilled draft (falls back to the
target's first 4 layers, with a warning, when the distilled draft is missing). Prompts:
distributed_spec/assets/bench_prompts.jsonl (chat, code, summarisation; chat template applied).

Our speculative methods run with each draft-length policy of --draft-lengths (engine/draft_length.py):
"<method>" a constant g; "<method>+adaptive" the adaptive schedule starting at g, capped by
--max-g; "<method>+conf<t>" at most g drafts, a row's block ending after a draft token with draft
probability < t (--confidence-threshold), the policy of Hugging Face assisted generation here. Reported per
(temperature, g, method), mean and spread over seeds: block efficiency (tokens per
target call, correction/bonus token counted), acceptance rate (accepted draft tokens / proposed),
tokens/s and speedup over our autoregressive decoding of the same prompts in the same run. All wall-
clock rows run at batch 1 (Hugging Face assisted generation cannot batch); a batch-size sweep of our
engine follows. The runs of one (temperature, seed) take turns prompt by prompt (batch by batch in
the sweep), so drift in the machine's speed hits them alike. Before the grid, the cost model behind
every speedup is measured: one target forward of n = 1..g+1 tokens and one draft forward, batch 1.
Writes results.md, results.json and PNG plots into --out.

--engine-table: our engine alone, its methods (--methods, default autoregressive, token, block) on the
short chat questions of scripts/common.py (--num-prompts, cycled), one g, T and seed, after a short
warm-up; every method runs --repeats times, interleaved, and its fastest run is kept. A markdown
table per batch size: tokens/s, speedup over autoregressive, block efficiency, target and draft
calls, acceptance per draft position, and where the time went (draft / target / verify / other).
Grid flags left out take the mode's defaults (GRID_DEFAULTS, ENGINE_DEFAULTS).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from distributed_spec.engine import EngineConfig, RunStats, SpeculativeEngine
from distributed_spec.engine.config import SamplingConfig, VerifierConfig
from scripts.common import (
    chat_ids,
    load_default_pair,
    markdown_table,
    mean_spread,
    pyplot,
    question_prompts,
    read_bench_prompts,
    save_figure,
)

logger = logging.getLogger("bench")

# Defaults of the grid flags left out, per mode.
GRID_DEFAULTS = dict(
    num_draft_tokens=[2, 4, 6, 8],
    temperatures=[0.0, 0.6, 1.0],
    seeds=[0, 1, 2],
    num_prompts=36,
    batch_sizes=[1, 4, 16],
    dtype="float32",
    threads=torch.get_num_threads(),
)
# One thread: on a small CPU shared with other jobs, multi-threaded small matmuls spin-wait and can
# run 10-100x slower than single-threaded ones.
ENGINE_DEFAULTS = dict(
    num_draft_tokens=[4], temperatures=[1.0], seeds=[0], num_prompts=8, batch_sizes=[8], dtype="auto", threads=1
)
# Sun et al., PaLM-2-S / PaLM-2-XXS, block over token verification: block efficiency gain per g.
PAPER_BLOCK_OVER_TOKEN = {4: 1.035, 6: 1.06, 8: 1.083}


@dataclass
class Measurement:
    temperature: float
    g: int
    method: str  # autoregressive | token | block | greedy (each also "+adaptive") | hf_assisted
    batch_size: int
    block_efficiency: list[float] = field(default_factory=list)
    acceptance_rate: list[float] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)
    # T = 0 only: fraction of prompts whose tokens equal our greedy autoregressive decoding's.
    same_as_autoregressive: list[float] = field(default_factory=list)

    def add(self, block_efficiency: float, acceptance_rate: float, tokens_per_s: float) -> None:
        self.block_efficiency.append(block_efficiency)
        self.acceptance_rate.append(acceptance_rate)
        self.tokens_per_s.append(tokens_per_s)


def speedups(results: list[Measurement], m: Measurement) -> list[float]:
    """m's tokens/s over autoregressive decoding's, seed by seed: each seed's runs took turns on the
    same prompts, so the ratio within a seed cancels what the machine's speed did meanwhile."""
    for ar in results:
        if (ar.method, ar.temperature, ar.batch_size) == ("autoregressive", m.temperature, m.batch_size):
            return [tps / ar_tps for tps, ar_tps in zip(m.tokens_per_s, ar.tokens_per_s)]
    return []


def load_prompts(tokenizer, num_prompts: int) -> tuple[list[list[int]], list[str]]:
    """The first num_prompts bench prompts, task types interleaved, as chat token ids; and their tasks."""
    records = read_bench_prompts()
    # Interleave the task types so that a prefix of the list still mixes them.
    by_task: dict[str, list[dict]] = {}
    for record in records:
        by_task.setdefault(record["task"], []).append(record)
    interleaved = [r for group in zip(*by_task.values()) for r in group][:num_prompts]
    return [chat_ids(tokenizer, r["messages"]) for r in interleaved], [r["task"] for r in interleaved]


def draft_length_options(label: str, g: int, max_draft_len: int) -> tuple[str, dict]:
    """ "block+adaptive" -> ("block", engine options); "+conf0.4" sets the confidence stop."""
    method, *policies = label.split("+")
    options: dict = {}
    for policy in policies:
        if policy == "adaptive":
            options.update(draft_len_schedule="adaptive", max_draft_len=max(max_draft_len, g))
        elif policy.startswith("conf"):
            options["draft_confidence_threshold"] = float(policy.removeprefix("conf"))
        else:
            raise ValueError(f"unknown draft-length policy {policy!r} in {label!r}")
    return method, options


@dataclass(frozen=True)
class Run:
    """One column of the comparison: a method (with its draft-length policy) at a block length g."""

    # autoregressive | token | block | greedy (each also "+adaptive" / "+conf<t>") | hf_assisted
    method: str
    g: int


@dataclass
class Tally:
    """What one Run produced over the prompts it has seen so far."""

    num_tokens: int = 0
    # Target calls per row (the denominator of block efficiency; the correction/bonus token counts).
    num_row_iterations: int = 0
    num_accepted: int = 0
    num_proposed: int = 0
    seconds: float = 0.0
    # Each prompt's generated token ids, in prompt order.
    outputs: list[list[int]] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        for name in (
            "num_tokens",
            "num_row_iterations",
            "num_accepted",
            "num_proposed",
            "seconds",
            "outputs",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def block_efficiency(self) -> float:
        return self.num_tokens / max(self.num_row_iterations, 1)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted / self.num_proposed if self.num_proposed else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds if self.seconds else 0.0


def run_engine(
    target, draft, prompts, method, g, temperature, seed, max_new_tokens, eos_ids, max_draft_len=8
) -> Tally:
    """One engine run over `prompts` (one batch); `method` may carry draft-length policies
    ("block+adaptive", "token+conf0.4")."""
    method, options = draft_length_options(method, g, max_draft_len)
    config = EngineConfig(
        VerifierConfig(method=method, num_draft_tokens=max(g, 1), **options),
        SamplingConfig(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed),
        max_batch_size=len(prompts),
        eos_token_ids=eos_ids,
    )
    engine = SpeculativeEngine(target.model, draft.model if method != "autoregressive" else None, config)
    start = time.perf_counter()
    results, stats = engine.generate_with_stats(prompts)
    elapsed = time.perf_counter() - start
    return Tally(
        num_tokens=stats.num_tokens,
        num_row_iterations=stats.num_row_iterations,
        num_accepted=sum(stats.num_accepted_per_position),
        num_proposed=sum(stats.num_proposed_per_position),
        seconds=elapsed,
        outputs=[result.token_ids for result in results],
    )


class _CallCounter:
    """Counts forward calls of a model (Hugging Face assisted generation reports none)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.count = 0
        self._handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, module, args) -> None:
        self.count += 1

    def remove(self) -> None:
        self._handle.remove()


def run_hf_assisted(target, draft, prompt, g, temperature, seed, max_new_tokens, eos_ids) -> Tally:
    """transformers `generate(assistant_model=...)` on one prompt (it raises for batches > 1): its own
    defaults with num_assistant_tokens = g, i.e. at most g drafts per target call, the drafting
    ended early once the assistant's probability of its token is below assistant_confidence_threshold
    (0.4; it only adapts when scikit-learn is installed); top-k/top-p off to match our sampling.
    Every target call (its first one also reads the prompt) emits its accepted drafts plus one token;
    acceptance = accepted drafts / drafted tokens (one assistant forward per drafted token)."""
    assistant_config = draft.model.generation_config
    saved_num_assistant_tokens = assistant_config.num_assistant_tokens
    # transformers takes the draft length from the assistant's own generation config (default 20),
    # not from generate()'s keyword arguments.
    assistant_config.num_assistant_tokens = g
    counter = _CallCounter(target.model)
    draft_counter = _CallCounter(draft.model)
    torch.manual_seed(seed)
    input_ids = torch.tensor([prompt])
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        if temperature > 0
        else {"do_sample": False}
    )
    start = time.perf_counter()
    try:
        output = target.model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            assistant_model=draft.model,
            num_assistant_tokens=g,
            max_new_tokens=max_new_tokens,
            eos_token_id=list(eos_ids) or None,
            pad_token_id=eos_ids[0] if eos_ids else None,
            **sampling,
        )
    finally:
        counter.remove()
        draft_counter.remove()
        assistant_config.num_assistant_tokens = saved_num_assistant_tokens
    elapsed = time.perf_counter() - start
    num_tokens = output.shape[1] - input_ids.shape[1]
    return Tally(
        num_tokens=num_tokens,
        num_row_iterations=counter.count,
        num_accepted=num_tokens - counter.count,
        num_proposed=draft_counter.count,
        seconds=elapsed,
        outputs=[output[0, input_ids.shape[1] :].tolist()],
    )


def run_interleaved(
    target, draft, prompts, runs: list[Run], temperature, seed, batch_size, max_new_tokens, eos_ids, max_draft_len
) -> dict[Run, Tally]:
    """Every run over the same prompts, taking turns batch by batch (rotating who goes first), so a
    slow spell of the machine (shared memory bandwidth drifts by 10-30% over minutes) hits every run
    alike instead of the one that happened to be running then."""
    tallies = {run: Tally() for run in runs}
    batches = [prompts[start : start + batch_size] for start in range(0, len(prompts), batch_size)]
    for index, batch in enumerate(batches):
        batch_seed = seed * 100_003 + index
        shift = index % len(runs)
        for run in runs[shift:] + runs[:shift]:
            if run.method == "hf_assisted":
                tally = run_hf_assisted(
                    target, draft, batch[0], run.g, temperature, batch_seed, max_new_tokens, eos_ids
                )
            else:
                tally = run_engine(
                    target,
                    draft,
                    batch,
                    run.method,
                    run.g,
                    temperature,
                    batch_seed,
                    max_new_tokens,
                    eos_ids,
                    max_draft_len,
                )
            tallies[run].add(tally)
    return tallies


def forward_costs(target, draft, max_tokens: int, repeats: int = 7) -> dict[str, list[float]]:
    """Median ms of one batch-1 forward over a 64-token context, target with n = 1..max_tokens new
    tokens and draft with 1: the cost model behind every speedup (an iteration costs one target
    forward of g + 1 tokens and g draft forwards of 1). Interleaved like the runs."""
    from distributed_spec.engine.runner import ModelRunner

    runners = {"target": ModelRunner(target.model), "draft": ModelRunner(draft.model)}
    # Any valid ids will do: a forward's cost does not depend on which tokens it reads.
    context = [index % target.model.config.vocab_size for index in range(1000, 1064)]
    for runner in runners.values():
        runner.prefill([context])
    shapes = [("target", n) for n in range(1, max_tokens + 1)] + [("draft", 1)]
    samples: dict[tuple[str, int], list[float]] = {shape: [] for shape in shapes}
    for _ in range(repeats):
        for name, n in shapes:
            runner = runners[name]
            input_ids = torch.tensor([context[:n]])
            start = time.perf_counter()
            runner.forward_tokens(input_ids)
            samples[(name, n)].append((time.perf_counter() - start) * 1e3)
            runner.rollback(torch.zeros(1, dtype=torch.long), n)
    return {
        "target_ms": [statistics.median(samples[("target", n)]) for n in range(1, max_tokens + 1)],
        "draft_ms": [statistics.median(samples[("draft", 1)])],
    }


def plot(results: list[Measurement], out: Path) -> list[Path]:
    plt = pyplot()
    paths = []
    temperatures = sorted({m.temperature for m in results if m.batch_size == 1})
    for metric, ylabel, name in [
        ("block_efficiency", "block efficiency (tokens / target call)", "block_efficiency_vs_gamma.png"),
        ("speedup", "speedup over autoregressive (tokens/s ratio)", "speedup_vs_gamma.png"),
    ]:
        fig, axes = plt.subplots(1, len(temperatures), figsize=(5 * len(temperatures), 4), squeeze=False)
        for ax, temperature in zip(axes[0], temperatures):
            for method in sorted({m.method for m in results if m.method != "autoregressive"}):
                rows = sorted(
                    (
                        m
                        for m in results
                        if m.method == method and m.temperature == temperature and m.batch_size == 1
                    ),
                    key=lambda m: m.g,
                )
                if not rows:
                    continue
                if metric == "speedup":
                    ys = [speedups(results, m) for m in rows]
                else:
                    ys = [getattr(m, metric) for m in rows]
                means = [statistics.fmean(y) for y in ys]
                spreads = [statistics.stdev(y) if len(y) > 1 else 0.0 for y in ys]
                ax.errorbar([m.g for m in rows], means, yerr=spreads, marker="o", capsize=3, label=method)
            ax.set_title(f"temperature {temperature}")
            ax.set_xlabel("g (draft block length)")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.legend()
        paths.append(save_figure(fig, out / name))
    fig, ax = plt.subplots(figsize=(5, 4))
    for temperature in temperatures:
        ratios = ratio_rows(results, temperature)
        if ratios:
            ax.plot(
                [g for g, _ in ratios], [r for _, r in ratios], marker="o", label=f"ours, T={temperature}"
            )
    ax.plot(
        list(PAPER_BLOCK_OVER_TOKEN),
        list(PAPER_BLOCK_OVER_TOKEN.values()),
        "k--",
        marker="s",
        label="Sun et al. (PaLM-2)",
    )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("g")
    ax.set_ylabel("block efficiency: block / token")
    ax.grid(alpha=0.3)
    ax.legend()
    paths.append(save_figure(fig, out / "block_over_token_vs_gamma.png"))
    return paths


def ratio_rows(results: list[Measurement], temperature: float) -> list[tuple[int, float]]:
    """(g, mean block efficiency of block / of token) at batch 1."""
    rows = []
    for g in sorted({m.g for m in results if m.method == "block" and m.temperature == temperature}):
        block = [
            m
            for m in results
            if (m.method, m.temperature, m.g, m.batch_size) == ("block", temperature, g, 1)
        ]
        token = [
            m
            for m in results
            if (m.method, m.temperature, m.g, m.batch_size) == ("token", temperature, g, 1)
        ]
        if block and token:
            rows.append(
                (
                    g,
                    statistics.fmean(block[0].block_efficiency) / statistics.fmean(token[0].block_efficiency),
                )
            )
    return rows


def markdown(results: list[Measurement], header: str) -> str:
    lines = [
        header,
        "",
        "| T | g | B | method | block efficiency | acceptance rate | tokens/s | speedup vs AR | same tokens as AR |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    # By batch size, then temperature, then g (autoregressive first): a grid run in parts (--append)
    # reads like one run; within a g the methods keep the order they ran in.
    for m in sorted(results, key=lambda m: (m.batch_size, m.temperature, m.g)):
        be, be_sd = mean_spread(m.block_efficiency)
        acc, acc_sd = mean_spread(m.acceptance_rate)
        tps, tps_sd = mean_spread(m.tokens_per_s)
        ratios = speedups(results, m)
        speedup = "{:.2f} ± {:.2f}".format(*mean_spread(ratios)) if ratios else "-"
        g = "-" if m.method == "autoregressive" else str(m.g)
        same = f"{statistics.fmean(m.same_as_autoregressive):.0%}" if m.same_as_autoregressive else "-"
        lines.append(
            f"| {m.temperature} | {g} | {m.batch_size} | {m.method} | {be:.3f} ± {be_sd:.3f} | {acc:.3f} ± {acc_sd:.3f} | "
            f"{tps:.1f} ± {tps_sd:.1f} | {speedup} | {same} |"
        )
    lines += [
        "",
        "Block over token verification, block efficiency ratio (ours vs Sun et al., PaLM-2 pair):",
        "",
    ]
    lines += ["| T | g | ours | paper |", "|---|---|---|---|"]
    for temperature in sorted({m.temperature for m in results}):
        for g, ratio in ratio_rows(results, temperature):
            paper = PAPER_BLOCK_OVER_TOKEN.get(g)
            lines.append(f"| {temperature} | {g} | {ratio:.3f} | {paper if paper else '-'} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-draft-tokens", "--gammas", type=int, nargs="+", default=None, help="draft tokens per row (g)")
    parser.add_argument("--temperatures", type=float, nargs="+", default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--batch-sizes", type=int, nargs="+", default=None, help="batch-size sweep of our engine"
    )
    parser.add_argument("--sweep-num-draft-tokens", "--sweep-gamma", type=int, default=4)
    parser.add_argument("--sweep-temperature", type=float, default=1.0)
    parser.add_argument(
        "--draft-lengths",
        nargs="+",
        choices=["constant", "adaptive", "confidence"],
        default=["constant", "adaptive", "confidence"],
        help="draft-length policies of our speculative methods",
    )
    parser.add_argument("--max-draft-len", "--max-gamma", type=int, default=8, help="cap of the adaptive schedule")
    parser.add_argument(
        "--confidence-threshold",
        type=float,
        default=0.4,
        help="the confidence policy's threshold (Hugging Face's default assistant_confidence_threshold)",
    )
    parser.add_argument(
        "--draft",
        choices=["auto", "distilled", "truncated"],
        default="auto",
        help="auto: the bundled distilled draft, else (with a warning) the truncated target",
    )
    parser.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default=None,
        help="weights of both models (the job's model.dtype); see docs/RESULTS.md for what each costs on a CPU",
    )
    parser.add_argument("--skip-hf", action="store_true", help="leave out Hugging Face assisted generation")
    parser.add_argument("--costs-only", action="store_true", help="print the forward-cost table and stop")
    parser.add_argument(
        "--append",
        action="store_true",
        help="add to the rows of --out/results.json (same --dtype) instead of starting over: a grid run in parts",
    )
    parser.add_argument("--threads", "--num-threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("docs/bench"))
    engine = parser.add_argument_group("engine table (--engine-table)")
    engine.add_argument(
        "--engine-table",
        action="store_true",
        help="our engine's methods on the short questions, a table per batch size (no grid)",
    )
    engine.add_argument(
        "--methods", default="autoregressive,token,block", help="comma-separated engine methods"
    )
    engine.add_argument(
        "--repeats", type=int, default=1, help="runs per method, interleaved; the fastest is kept"
    )
    engine.add_argument("--stop-at-eos", action="store_true", help="end rows at the tokenizer's EOS")
    engine.add_argument("--num-layers", type=int, default=4, help="layers of the truncated draft")
    engine.add_argument(
        "--distilled-dir", default=None, help="distilled checkpoint (default: the bundled one)"
    )
    engine.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    for key, value in (ENGINE_DEFAULTS if args.engine_table else GRID_DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.engine_table and any(len(getattr(args, key)) > 1 for key in ("num_draft_tokens", "temperatures", "seeds")):
        parser.error("--engine-table runs one g, temperature and seed (one value each)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    if args.engine_table:
        print(engine_tables(args))
        return
    args.out.mkdir(parents=True, exist_ok=True)

    target, draft = load_default_pair(
        args.draft, args.dtype, args.num_layers, distilled_dir=args.distilled_dir
    )
    prompts, tasks = load_prompts(target.tokenizer, args.num_prompts)
    eos_ids = tuple(i for i in [target.tokenizer.eos_token_id] if i is not None)
    logger.info(
        "target %s, draft %s, %d prompts (%s)",
        target.name,
        draft.name,
        len(prompts),
        ", ".join(sorted(set(tasks))),
    )
    with torch.no_grad():
        costs = forward_costs(target, draft, max(args.num_draft_tokens + [args.sweep_gamma]) + 1)
    logger.info("forward ms: target %s, draft %s", costs["target_ms"], costs["draft_ms"])
    if args.costs_only:
        print(f"{args.dtype}, {args.threads} threads\n\n{cost_table(costs)}")
        return
    results: list[Measurement] = load_results(args.out / "results.json", args.dtype) if args.append else []

    def measurement(temperature: float, g: int, method: str, batch_size: int) -> Measurement:
        for m in results:
            if (m.temperature, m.g, m.method, m.batch_size) == (temperature, g, method, batch_size):
                return m
        results.append(Measurement(temperature, g, method, batch_size))
        return results[-1]

    def record(tallies: dict[Run, Tally], temperature: float, batch_size: int, seed: int) -> None:
        for run, tally in tallies.items():
            m = measurement(temperature, run.g, run.method, batch_size)
            m.add(tally.block_efficiency, tally.acceptance_rate, tally.tokens_per_s)
            if temperature == 0:
                reference = tallies[Run("autoregressive", 0)].outputs
                same = sum(a == b for a, b in zip(tally.outputs, reference)) / len(reference)
                m.same_as_autoregressive.append(same)
            logger.info(
                "T=%s B=%d seed=%d g=%d %s: BE %.3f, acceptance %.3f, %.1f tokens/s",
                temperature,
                batch_size,
                seed,
                run.g,
                run.method,
                tally.block_efficiency,
                tally.acceptance_rate,
                tally.tokens_per_s,
            )

    common = {"max_new_tokens": args.max_new_tokens, "eos_ids": eos_ids, "max_draft_len": args.max_draft_len}
    suffixes = {"constant": "", "adaptive": "+adaptive", "confidence": f"+conf{args.confidence_threshold}"}
    for temperature in args.temperatures:
        verifiers = ["greedy"] if temperature == 0 else ["token", "block"]
        methods = [verifier + suffixes[policy] for policy in args.draft_lengths for verifier in verifiers]
        if not args.skip_hf:
            methods.append("hf_assisted")
        runs = [Run("autoregressive", 0)] + [
            Run(method, g) for g in args.num_draft_tokens for method in methods
        ]
        # Temperature 0 draws no random numbers: every seed gives the same tokens, so one seed is run.
        for seed in args.seeds[:1] if temperature == 0 else args.seeds:
            record(
                run_interleaved(target, draft, prompts, runs, temperature, seed, 1, **common),
                temperature,
                1,
                seed,
            )
        write_results(results, costs, args, target, draft, prompts)
    sweep_method = "greedy" if args.sweep_temperature == 0 else "block"
    sweep_runs = [Run("autoregressive", 0)] + [
        Run(sweep_method + suffixes[policy], args.sweep_gamma) for policy in args.draft_lengths
    ]
    for batch_size in args.batch_sizes:
        if (
            batch_size == 1
            and args.sweep_temperature in args.temperatures
            and args.sweep_gamma in args.num_draft_tokens
        ):
            continue  # already measured above
        for seed in args.seeds:
            tallies = run_interleaved(
                target, draft, prompts, sweep_runs, args.sweep_temperature, seed, batch_size, **common
            )
            record(tallies, args.sweep_temperature, batch_size, seed)

    write_results(results, costs, args, target, draft, prompts, final=True)


ENGINE_COLUMNS = [
    "method",
    "tokens/s",
    "speedup",
    "block efficiency",
    "target calls",
    "draft calls",
    "acceptance per position",
    "draft / target / verify / other s",
]


def engine_row(method: str, stats: RunStats, baseline_tokens_per_s: float) -> list[str]:
    """One line of the engine table (ENGINE_COLUMNS)."""
    acceptance = " ".join(f"{rate:.2f}" for rate in stats.acceptance_per_position) or "-"
    speedup = stats.tokens_per_s / baseline_tokens_per_s if baseline_tokens_per_s else float("nan")
    return [
        method,
        f"{stats.tokens_per_s:.1f}",
        f"{speedup:.2f}x",
        f"{stats.block_efficiency:.2f}",
        str(stats.num_target_calls),
        str(stats.num_draft_calls),
        acceptance,
        f"{stats.draft_s:.1f} / {stats.target_s:.1f} / {stats.verify_s:.2f} / {stats.other_s:.2f}",
    ]


def engine_table(target, draft, prompts: list[list[int]], methods: list[str], batch_size: int, args) -> str:
    """Every method over the same prompts at one batch size, best of --repeats interleaved runs."""
    tokenizer = target.tokenizer
    sampling = SamplingConfig(
        temperature=args.temperatures[0], max_new_tokens=args.max_new_tokens, seed=args.seeds[0]
    )
    eos_ids = (tokenizer.eos_token_id,) if args.stop_at_eos else ()

    def config(method: str) -> EngineConfig:
        verifier = VerifierConfig(method=method, num_draft_tokens=args.num_draft_tokens[0])
        return EngineConfig(verifier, sampling, max_batch_size=batch_size, eos_token_ids=eos_ids)

    engines = {
        method: SpeculativeEngine(target.model, draft.model, config(method), tokenizer=tokenizer)
        for method in methods
    }
    for engine in engines.values():
        engine.generate(prompts[:1])  # warm-up: first-call allocations stay out of the timing
    best: dict[str, RunStats] = {}
    for repeat in range(args.repeats):
        for method, engine in engines.items():
            results, stats = engine.generate_with_stats(prompts)
            logger.info("%s (run %d): %d tokens in %.1f s", method, repeat, stats.num_tokens, stats.total_s)
            if method not in best or stats.tokens_per_s > best[method].tokens_per_s:
                best[method] = stats
            if repeat == 0:
                logger.info("%s sample: %r", method, tokenizer.decode(results[0].token_ids))
    baseline = best["autoregressive"].tokens_per_s if "autoregressive" in best else 0.0
    title = (
        f"target smollm2, draft {draft.name}, g={args.num_draft_tokens[0]}, T={args.temperatures[0]}, "
        f"{len(prompts)} prompts x {args.max_new_tokens} new tokens, batch {batch_size}, "
        f"device {args.device}, {args.threads} thread(s), best of {args.repeats}"
    )
    return (
        title + "\n\n" + markdown_table(ENGINE_COLUMNS, [engine_row(m, best[m], baseline) for m in methods])
    )


def engine_tables(args) -> str:
    """--engine-table: the engine table at each of --batch-sizes."""
    target, draft = load_default_pair(
        args.draft, args.dtype, args.num_layers, distilled_dir=args.distilled_dir, device=args.device
    )
    prompts = question_prompts(target.tokenizer, args.num_prompts)
    methods = args.methods.split(",")
    return "\n\n".join(
        engine_table(target, draft, prompts, methods, batch_size, args) for batch_size in args.batch_sizes
    )


def load_results(path: Path, dtype: str) -> list[Measurement]:
    """The rows an earlier run wrote (for --append); refuses a file measured with another dtype."""
    if not path.is_file():
        raise SystemExit(f"--append: {path} does not exist; run once without --append first")
    payload = json.loads(path.read_text())
    if payload.get("dtype") != dtype:
        raise SystemExit(f"--append: {path} was measured with --dtype {payload.get('dtype')}, not {dtype}")
    return [Measurement(**row) for row in payload["results"]]


def cost_table(costs: dict[str, list[float]]) -> str:
    """The forward costs as a markdown table, with T(n) / T(1)."""
    target_ms = costs["target_ms"]
    lines = [
        "Forward cost at batch 1 (median ms; 64-token context), measured in the same run:",
        "",
        "| n new tokens | " + " | ".join(str(n) for n in range(1, len(target_ms) + 1)) + " |",
        "|---|" + "---|" * len(target_ms),
        "| target ms | " + " | ".join(f"{ms:.1f}" for ms in target_ms) + " |",
        "| target T(n) / T(1) | " + " | ".join(f"{ms / target_ms[0]:.2f}" for ms in target_ms) + " |",
        "",
        f"Draft, one token: {costs['draft_ms'][0]:.1f} ms ({costs['draft_ms'][0] / target_ms[0]:.3f} of the target's).",
    ]
    return "\n".join(lines)


def write_results(results, costs, args, target, draft, prompts, final: bool = False) -> None:
    """Table (markdown, json) under --out; plots and the printout only at the end. Called after every
    temperature too, so that an interrupted run keeps what it measured."""
    header = (
        f"target {target.name}, draft {draft.name}, {args.dtype}; {len(prompts)} prompts, {args.max_new_tokens} new "
        f"tokens, seeds {args.seeds} (T = 0: the first only), {args.threads} threads; mean ± std over seeds; runs take "
        f"turns prompt by prompt. +adaptive: g starts at the g column, adapts per row up to {args.max_draft_len}; "
        "+conf<t>: at most g drafts, a row's block ends after a draft token whose draft probability is below t"
    )
    table = markdown(results, header) + "\n\n" + cost_table(costs)
    (args.out / "results.md").write_text(table + "\n")
    payload = {"dtype": args.dtype, "forward_costs": costs, "results": [m.__dict__ for m in results]}
    (args.out / "results.json").write_text(json.dumps(payload, indent=1))
    if final:
        print(table)
        for path in plot(results, args.out):
            logger.info("wrote %s", path)


if __name__ == "__main__":
    main()
