"""Side-by-side benchmark: our engine (autoregressive, token, block, greedy) vs Hugging Face assisted
generation, same models, prompts and seeds, in one run.

    python -m scripts.bench                                   # the full grid (hours on 2 CPU cores)
    python -m scripts.bench --num-prompts 12 --max-new-tokens 32 --seeds 0 --out docs/bench
    python -m scripts.bench --dtype bfloat16 ...              # both models' weights in bf16
    python -m scripts.bench --costs-only --dtype float32      # the forward-cost table alone (seconds)

Default pair: SmolLM2-135M-Instruct target with the bundled distilled draft (falls back to the
target's first 4 layers, with a warning, when the distilled draft is missing). Prompts:
distributed_spec/assets/bench_prompts.jsonl (chat, code, summarisation; chat template applied).

Our speculative methods run with each draft-length policy of --draft-lengths (engine/draft_length.py):
"<method>" a constant g; "<method>+adaptive" the adaptive schedule starting at g, capped by
--max-gamma; "<method>+conf<t>" at most g drafts, a row's block ending after a draft token with draft
probability < t (--confidence-threshold), the policy of Hugging Face assisted generation here. Reported per
(temperature, gamma, method), mean and spread over seeds: block efficiency (tokens per
target call, correction/bonus token counted), acceptance rate (accepted draft tokens / proposed),
tokens/s and speedup over our autoregressive decoding of the same prompts in the same run. All wall-
clock rows run at batch 1 (Hugging Face assisted generation cannot batch); a batch-size sweep of our
engine follows. The runs of one (temperature, seed) take turns prompt by prompt (batch by batch in
the sweep), so drift in the machine's speed hits them alike. Before the grid, the cost model behind
every speedup is measured: one target forward of n = 1..g+1 tokens and one draft forward, batch 1.
Writes results.md, results.json and PNG plots into --out.
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

from distributed_spec.engine import EngineConfig, SpeculativeEngine
from distributed_spec.models import LoadedModel, ModelConfig, ModelSpec, load_pair
from distributed_spec.verify import SamplingParams

logger = logging.getLogger("bench")

PROMPTS_PATH = Path(__file__).resolve().parent.parent / "distributed_spec" / "assets" / "bench_prompts.jsonl"
# Sun et al., PaLM-2-S / PaLM-2-XXS, block over token verification: block efficiency gain per gamma.
PAPER_BLOCK_OVER_TOKEN = {4: 1.035, 6: 1.06, 8: 1.083}


@dataclass
class Measurement:
    temperature: float
    gamma: int
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


def _mean_spread(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def load_default_pair(draft: str, dtype: str = "float32") -> tuple[LoadedModel, LoadedModel]:
    """The embedded SmolLM2 target with the bundled distilled draft (or its first 4 layers)."""
    if draft == "distilled":
        try:
            from distributed_spec.models.distilled import DISTILLED_SMOLLM2_DRAFT_DIR

            return load_pair(ModelConfig(draft=ModelSpec(str(DISTILLED_SMOLLM2_DRAFT_DIR), kind="distilled"), dtype=dtype))
        except (ImportError, FileNotFoundError, OSError) as error:
            logger.warning("distilled draft unavailable (%s); using the target's first 4 layers", error)
    return load_pair(ModelConfig(draft=ModelSpec(kind="truncated", num_layers=4), dtype=dtype))


def load_prompts(tokenizer, num_prompts: int) -> tuple[list[list[int]], list[str]]:
    records = [json.loads(line) for line in PROMPTS_PATH.read_text().splitlines() if line.strip()]
    # Interleave the task types so that a prefix of the list still mixes them.
    by_task: dict[str, list[dict]] = {}
    for record in records:
        by_task.setdefault(record["task"], []).append(record)
    interleaved = [r for group in zip(*by_task.values()) for r in group][:num_prompts]
    prompts = [
        tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=True, return_dict=False)
        for r in interleaved
    ]
    return [list(p) for p in prompts], [r["task"] for r in interleaved]


def draft_length_options(label: str, gamma: int, max_gamma: int) -> tuple[str, dict]:
    """"block+adaptive" -> ("block", engine options); "+conf0.4" sets the confidence stop."""
    method, *policies = label.split("+")
    options: dict = {}
    for policy in policies:
        if policy == "adaptive":
            options.update(gamma_schedule="adaptive", max_gamma=max(max_gamma, gamma))
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
    gamma: int


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
        for name in ("num_tokens", "num_row_iterations", "num_accepted", "num_proposed", "seconds", "outputs"):
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


def run_engine(target, draft, prompts, method, gamma, temperature, seed, max_new_tokens, eos_ids, max_gamma=8) -> Tally:
    """One engine run over `prompts` (one batch); `method` may carry draft-length policies
    ("block+adaptive", "token+conf0.4")."""
    method, options = draft_length_options(method, gamma, max_gamma)
    config = EngineConfig(
        method=method,
        gamma=max(gamma, 1),
        **options,
        sampling=SamplingParams(temperature=temperature),
        max_new_tokens=max_new_tokens,
        max_batch_size=len(prompts),
        seed=seed,
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


def run_hf_assisted(target, draft, prompt, gamma, temperature, seed, max_new_tokens, eos_ids) -> Tally:
    """transformers `generate(assistant_model=...)` on one prompt (it raises for batches > 1): its own
    defaults with num_assistant_tokens = gamma, i.e. at most g drafts per target call, the drafting
    ended early once the assistant's probability of its token is below assistant_confidence_threshold
    (0.4; it only adapts when scikit-learn is installed); top-k/top-p off to match our sampling.
    Every target call (its first one also reads the prompt) emits its accepted drafts plus one token;
    acceptance = accepted drafts / drafted tokens (one assistant forward per drafted token)."""
    assistant_config = draft.model.generation_config
    saved_num_assistant_tokens = assistant_config.num_assistant_tokens
    # transformers takes the draft length from the assistant's own generation config (default 20),
    # not from generate()'s keyword arguments.
    assistant_config.num_assistant_tokens = gamma
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
            num_assistant_tokens=gamma,
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
    target, draft, prompts, runs: list[Run], temperature, seed, batch_size, max_new_tokens, eos_ids, max_gamma
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
                tally = run_hf_assisted(target, draft, batch[0], run.gamma, temperature, batch_seed, max_new_tokens, eos_ids)
            else:
                tally = run_engine(
                    target, draft, batch, run.method, run.gamma, temperature, batch_seed, max_new_tokens, eos_ids, max_gamma
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
                    (m for m in results if m.method == method and m.temperature == temperature and m.batch_size == 1),
                    key=lambda m: m.gamma,
                )
                if not rows:
                    continue
                if metric == "speedup":
                    ys = [speedups(results, m) for m in rows]
                else:
                    ys = [getattr(m, metric) for m in rows]
                means = [statistics.fmean(y) for y in ys]
                spreads = [statistics.stdev(y) if len(y) > 1 else 0.0 for y in ys]
                ax.errorbar([m.gamma for m in rows], means, yerr=spreads, marker="o", capsize=3, label=method)
            ax.set_title(f"temperature {temperature}")
            ax.set_xlabel("gamma (draft block length)")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.legend()
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        paths.append(out / name)
    fig, ax = plt.subplots(figsize=(5, 4))
    for temperature in temperatures:
        ratios = ratio_rows(results, temperature)
        if ratios:
            ax.plot([g for g, _ in ratios], [r for _, r in ratios], marker="o", label=f"ours, T={temperature}")
    ax.plot(list(PAPER_BLOCK_OVER_TOKEN), list(PAPER_BLOCK_OVER_TOKEN.values()), "k--", marker="s", label="Sun et al. (PaLM-2)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("gamma")
    ax.set_ylabel("block efficiency: block / token")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "block_over_token_vs_gamma.png", dpi=100)
    plt.close(fig)
    paths.append(out / "block_over_token_vs_gamma.png")
    return paths


def ratio_rows(results: list[Measurement], temperature: float) -> list[tuple[int, float]]:
    """(gamma, mean block efficiency of block / of token) at batch 1."""
    rows = []
    for gamma in sorted({m.gamma for m in results if m.method == "block" and m.temperature == temperature}):
        block = [m for m in results if (m.method, m.temperature, m.gamma, m.batch_size) == ("block", temperature, gamma, 1)]
        token = [m for m in results if (m.method, m.temperature, m.gamma, m.batch_size) == ("token", temperature, gamma, 1)]
        if block and token:
            rows.append((gamma, statistics.fmean(block[0].block_efficiency) / statistics.fmean(token[0].block_efficiency)))
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
    for m in sorted(results, key=lambda m: (m.batch_size, m.temperature, m.gamma)):
        be, be_sd = _mean_spread(m.block_efficiency)
        acc, acc_sd = _mean_spread(m.acceptance_rate)
        tps, tps_sd = _mean_spread(m.tokens_per_s)
        ratios = speedups(results, m)
        speedup = f"{_mean_spread(ratios)[0]:.2f} ± {_mean_spread(ratios)[1]:.2f}" if ratios else "-"
        gamma = "-" if m.method == "autoregressive" else str(m.gamma)
        same = f"{statistics.fmean(m.same_as_autoregressive):.0%}" if m.same_as_autoregressive else "-"
        lines.append(
            f"| {m.temperature} | {gamma} | {m.batch_size} | {m.method} | {be:.3f} ± {be_sd:.3f} | {acc:.3f} ± {acc_sd:.3f} | "
            f"{tps:.1f} ± {tps_sd:.1f} | {speedup} | {same} |"
        )
    lines += ["", "Block over token verification, block efficiency ratio (ours vs Sun et al., PaLM-2 pair):", ""]
    lines += ["| T | g | ours | paper |", "|---|---|---|---|"]
    for temperature in sorted({m.temperature for m in results}):
        for gamma, ratio in ratio_rows(results, temperature):
            paper = PAPER_BLOCK_OVER_TOKEN.get(gamma)
            lines.append(f"| {temperature} | {gamma} | {ratio:.3f} | {paper if paper else '-'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gammas", type=int, nargs="+", default=[2, 4, 6, 8])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.6, 1.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--num-prompts", type=int, default=36)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16], help="batch-size sweep of our engine")
    parser.add_argument("--sweep-gamma", type=int, default=4)
    parser.add_argument("--sweep-temperature", type=float, default=1.0)
    parser.add_argument(
        "--draft-lengths", nargs="+", choices=["constant", "adaptive", "confidence"],
        default=["constant", "adaptive", "confidence"], help="draft-length policies of our speculative methods",
    )
    parser.add_argument("--max-gamma", type=int, default=8, help="cap of the adaptive schedule")
    parser.add_argument(
        "--confidence-threshold", type=float, default=0.4,
        help="the confidence policy's threshold (Hugging Face's default assistant_confidence_threshold)",
    )
    parser.add_argument("--draft", choices=["distilled", "truncated"], default="distilled")
    parser.add_argument(
        "--dtype", choices=["float32", "bfloat16"], default="float32",
        help="weights of both models (the job's model.dtype); see docs/RESULTS.md for what each costs on a CPU",
    )
    parser.add_argument("--skip-hf", action="store_true", help="leave out Hugging Face assisted generation")
    parser.add_argument("--costs-only", action="store_true", help="print the forward-cost table and stop")
    parser.add_argument(
        "--append", action="store_true",
        help="add to the rows of --out/results.json (same --dtype) instead of starting over: a grid run in parts",
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", type=Path, default=Path("docs/bench"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)

    target, draft = load_default_pair(args.draft, args.dtype)
    prompts, tasks = load_prompts(target.tokenizer, args.num_prompts)
    eos_ids = tuple(i for i in [target.tokenizer.eos_token_id] if i is not None)
    logger.info("target %s, draft %s, %d prompts (%s)", target.name, draft.name, len(prompts), ", ".join(sorted(set(tasks))))
    with torch.no_grad():
        costs = forward_costs(target, draft, max(args.gammas + [args.sweep_gamma]) + 1)
    logger.info("forward ms: target %s, draft %s", costs["target_ms"], costs["draft_ms"])
    if args.costs_only:
        print(f"{args.dtype}, {args.threads} threads\n\n{cost_table(costs)}")
        return
    results: list[Measurement] = load_results(args.out / "results.json", args.dtype) if args.append else []

    def measurement(temperature: float, gamma: int, method: str, batch_size: int) -> Measurement:
        for m in results:
            if (m.temperature, m.gamma, m.method, m.batch_size) == (temperature, gamma, method, batch_size):
                return m
        results.append(Measurement(temperature, gamma, method, batch_size))
        return results[-1]

    def record(tallies: dict[Run, Tally], temperature: float, batch_size: int, seed: int) -> None:
        for run, tally in tallies.items():
            m = measurement(temperature, run.gamma, run.method, batch_size)
            m.add(tally.block_efficiency, tally.acceptance_rate, tally.tokens_per_s)
            if temperature == 0:
                reference = tallies[Run("autoregressive", 0)].outputs
                same = sum(a == b for a, b in zip(tally.outputs, reference)) / len(reference)
                m.same_as_autoregressive.append(same)
            logger.info(
                "T=%s B=%d seed=%d g=%d %s: BE %.3f, acceptance %.3f, %.1f tokens/s",
                temperature, batch_size, seed, run.gamma, run.method, tally.block_efficiency, tally.acceptance_rate,
                tally.tokens_per_s,
            )

    common = {"max_new_tokens": args.max_new_tokens, "eos_ids": eos_ids, "max_gamma": args.max_gamma}
    suffixes = {"constant": "", "adaptive": "+adaptive", "confidence": f"+conf{args.confidence_threshold}"}
    for temperature in args.temperatures:
        verifiers = ["greedy"] if temperature == 0 else ["token", "block"]
        methods = [verifier + suffixes[policy] for policy in args.draft_lengths for verifier in verifiers]
        if not args.skip_hf:
            methods.append("hf_assisted")
        runs = [Run("autoregressive", 0)] + [Run(method, gamma) for gamma in args.gammas for method in methods]
        # Temperature 0 draws no random numbers: every seed gives the same tokens, so one seed is run.
        for seed in args.seeds[:1] if temperature == 0 else args.seeds:
            record(run_interleaved(target, draft, prompts, runs, temperature, seed, 1, **common), temperature, 1, seed)
        write_results(results, costs, args, target, draft, prompts)
    sweep_method = "greedy" if args.sweep_temperature == 0 else "block"
    sweep_runs = [Run("autoregressive", 0)] + [
        Run(sweep_method + suffixes[policy], args.sweep_gamma) for policy in args.draft_lengths
    ]
    for batch_size in args.batch_sizes:
        if batch_size == 1 and args.sweep_temperature in args.temperatures and args.sweep_gamma in args.gammas:
            continue  # already measured above
        for seed in args.seeds:
            tallies = run_interleaved(target, draft, prompts, sweep_runs, args.sweep_temperature, seed, batch_size, **common)
            record(tallies, args.sweep_temperature, batch_size, seed)

    write_results(results, costs, args, target, draft, prompts, final=True)


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
        f"turns prompt by prompt. +adaptive: g starts at the g column, adapts per row up to {args.max_gamma}; "
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
