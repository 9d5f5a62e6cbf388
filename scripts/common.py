"""What the benchmarks share: the bundled prompts, the default model pair, timing, markdown tables,
plots, and jobs run on a pair loaded once.

Heavy imports (transformers, hydra, matplotlib) stay inside the functions that need them, so that a
light benchmark (scripts/bench_verify.py) imports this module without them.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

logger = logging.getLogger("scripts")

BENCH_PROMPTS_PATH = Path(__file__).resolve().parents[1] / "distributed_spec" / "assets" / "bench_prompts.jsonl"

# Short chat questions: the prompts of the engine table (scripts/bench.py --engine-table) and of
# scripts/bench_distributed.py.
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in two sentences.",
    "List three uses of a paperclip.",
    "What is 12 times 7?",
    "Give me a tip for learning a new language.",
    "Describe a cat to someone who has never seen one.",
    "Why is the sky blue?",
]


# ----------------------------------------------------------------------------- prompts


def read_bench_prompts() -> list[dict]:
    """The records of distributed_spec/assets/bench_prompts.jsonl: id, task, messages."""
    lines = BENCH_PROMPTS_PATH.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a chat through the tokenizer's template, with the generation prompt."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    # Some tokenizers return a BatchEncoding whatever return_dict says.
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def question_prompts(tokenizer, num_prompts: int = len(QUESTIONS)) -> list[list[int]]:
    """QUESTIONS, cycled to num_prompts, as chat prompts."""
    questions = [QUESTIONS[index % len(QUESTIONS)] for index in range(num_prompts)]
    return [chat_ids(tokenizer, [{"role": "user", "content": question}]) for question in questions]


# ----------------------------------------------------------------------------- model pair


def draft_spec(draft: str = "auto", num_layers: int = 4, distilled_dir: str | None = None):
    """The draft of the default pair as a ModelSpec (model.draft).

    draft: "distilled" (the bundled distilled draft, or distilled_dir; an error when missing),
    "truncated" (the target's first num_layers layers: untrained, low acceptance) or "auto" (distilled
    when its checkpoint exists, else truncated with a warning).
    """
    from distributed_spec.models import ModelSpec
    from distributed_spec.models.distilled import DISTILLED_SMOLLM2_DRAFT_DIR

    truncated = ModelSpec(kind="truncated", num_layers=num_layers)
    if draft == "truncated":
        return truncated
    checkpoint = Path(distilled_dir) if distilled_dir else Path(DISTILLED_SMOLLM2_DRAFT_DIR)
    if checkpoint.is_dir():
        return ModelSpec(str(checkpoint), kind="distilled")
    if draft == "distilled":
        raise SystemExit(f"--draft distilled: no distilled checkpoint at {checkpoint}")
    logger.warning("no distilled draft at %s; using the target's first %d layers", checkpoint, num_layers)
    return truncated


def load_default_pair(draft: str = "auto", dtype: str = "float32", num_layers: int = 4,
                      distilled_dir: str | None = None, device: str = "cpu"):
    """(target, draft) LoadedModels: the embedded SmolLM2 target and draft_spec(draft, ...)."""
    from distributed_spec.models import ModelConfig, ModelSpec, load_pair

    pair = ModelConfig(target=ModelSpec("smollm2"), draft=draft_spec(draft, num_layers, distilled_dir), dtype=dtype)
    return load_pair(pair, device=device)


# ----------------------------------------------------------------------------- statistics and timing


def mean(values: Sequence[float]) -> float:
    """The mean, nan for no values (a table cell that has nothing to average)."""
    return statistics.fmean(values) if values else float("nan")


def mean_spread(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample standard deviation; 0 for one value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def time_calls(
    calls: dict[str, Callable[[], object]],
    iters: int,
    reduce: Callable[[list[float]], float] = min,
    sync: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Seconds per call of each, reduced over `iters` calls (min: the least disturbed; or a median)
    after one warm-up call each (which compiles kernels and allocates). The calls take turns, so load
    or frequency changes on the machine hit every one alike. sync (e.g. torch.cuda.synchronize) runs
    before and after each timed call so that asynchronous work is counted."""
    for fn in calls.values():
        fn()
    durations: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(iters):
        for name, fn in calls.items():
            if sync is not None:
                sync()
            start = time.perf_counter()
            fn()
            if sync is not None:
                sync()
            durations[name].append(time.perf_counter() - start)
    return {name: reduce(times) for name, times in durations.items()}


# ----------------------------------------------------------------------------- tables and plots


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None) -> str:
    """A markdown table: a header, its rule and one line per row (cells formatted by str).

    align: one character per column, "l" (the default rule "---") or "r" ("---:").
    """
    rule = ["---:" if (align and align[index] == "r") else "---" for index in range(len(columns))]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def human_bytes(num_bytes: float) -> str:
    """1536 -> "1.5 KB" (powers of 1024)."""
    for unit in ("B", "KB", "MB", "GB"):
        if num_bytes < 1024 or unit == "GB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    return str(num_bytes)


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only: no display on a server)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_lines(ax, series: dict[str, list[tuple[float, float]]], title: str, xlabel: str, ylabel: str,
               log2_x: bool = False, styles: dict[str, dict] | None = None) -> None:
    """One panel: a line with markers per series (label -> [(x, y)], sorted by x here)."""
    for label, points in series.items():
        points = sorted(points)
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=label,
                **(styles or {}).get(label, {}))
    if log2_x:
        ax.set_xscale("log", base=2)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def save_figure(fig, path: Path) -> Path:
    """tight_layout, write as PNG (100 dpi), close."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    pyplot().close(fig)
    return path


def save_results(out: Path, measurements: list, rows: list[dict], text: str, plot_rows) -> None:
    """results.json (measurements and rows), results.md (text) and plot_rows(rows, out) into out."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(
        json.dumps({"measurements": [m.__dict__ for m in measurements], "rows": rows}, indent=1) + "\n"
    )
    (out / "results.md").write_text(text)
    plot_rows(rows, out)


# ----------------------------------------------------------------------------- jobs


def run_grid_and_report(args, run_grid: Callable, write_results: Callable) -> None:
    """A job benchmark's main body: run_grid(args, work) in a scratch directory (with the tiny pair
    saved there under --tiny), write_results(measurements, args) to --out, then print the results."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.tiny:
            from tests.jobs.fakes import save_tiny_pair

            args.tiny_dirs = save_tiny_pair(work / "tiny")
        start = time.perf_counter()
        measurements = run_grid(args, work)
        write_results(measurements, args)
    print((Path(args.out) / "results.md").read_text())
    print(f"{len(measurements)} runs in {time.perf_counter() - start:.0f} s -> {args.out}")




# The runtimes a benchmark runs the job in: the single-process engine; Ray at TP = 1 and 2 as the job
# runs it by default (parallel.draft_in_shard=auto: inside shard 0 at TP = 1, a draft actor at 2);
# and each with one variant: the draft placed explicitly (inside shard 0, or in an actor of its own),
# or bf16 linears packed once for oneDNN (model.cpu_prepack).
RUNTIME_VARIANTS = {
    "": [],
    "in-shard": ["parallel.draft_in_shard=true"],
    "draft-actor": ["parallel.draft_in_shard=false"],
    "packed": ["model.cpu_prepack=true"],
}
RUNTIMES = tuple(
    f"{base}-{variant}" if variant else base
    for base in ("local", "ray1", "ray2")
    for variant in RUNTIME_VARIANTS
    if base != "local" or variant in ("", "packed")
)


def runtime_overrides(runtime: str) -> list[str]:
    """The job's overrides for one of RUNTIMES."""
    base, _, variant = runtime.partition("-")
    overrides = [] if base == "local" else ["parallel=ray", f"parallel.tp_size={base.removeprefix('ray')}"]
    return overrides + RUNTIME_VARIANTS[variant]


def base_job(args, runtime: str, input_path: Path):
    """The JobConfig `python -m distributed_spec.generate` composes from conf/ (the default pair; with
    args.tiny the tiny pair in args.tiny_dirs; else model.dtype=args.dtype), in `runtime` (one of RUNTIMES)."""
    from hydra import compose, initialize_config_dir

    from distributed_spec.config import JobConfig
    from distributed_spec.hydra_config import CONF_DIR

    overrides = [
        f"data.input_path={input_path}",
        "data.resume=false",
        "tracking=disabled",
        "tracking.progress=false",
        "log_level=WARNING",
        "parallel.device=cpu",
    ]
    if args.tiny:
        target_dir, draft_dir = args.tiny_dirs
        overrides += [
            "model.name=tiny",
            f"model.target.source={target_dir}",
            "model.target.kind=dir",
            f"model.draft.source={draft_dir}",
            "model.draft.kind=dir",
        ]
    else:
        overrides.append(f"model.dtype={args.dtype}")
    overrides += runtime_overrides(runtime)
    # The caller's own, last, so that they win (e.g. parallel.num_cpus_per_shard=2).
    overrides += list(getattr(args, "overrides", None) or [])
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return JobConfig.from_dictconfig(compose(config_name="generate", overrides=overrides))


class KeepOpen:
    """A loaded generator, lent to one job at a time (the job closes what it is given)."""

    def __init__(self, generator) -> None:
        self._generator = generator

    def __getattr__(self, name):
        return getattr(self._generator, name)

    def close(self) -> None:
        pass


def measure(generator, job, out_dir: Path) -> dict:
    """One job on an already loaded generator (reconfigured for it); returns the job's summary."""
    from distributed_spec.jobs.runner import run

    generator.reconfigure(job)
    return run(job, output_dir=out_dir, generator=KeepOpen(generator))
