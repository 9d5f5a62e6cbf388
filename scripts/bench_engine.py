"""Benchmark the single-process engine on SmolLM2: autoregressive vs speculative (token, block).

    .venv/bin/python scripts/bench_engine.py                      # 8 prompts, 64 new tokens, g = 4
    .venv/bin/python scripts/bench_engine.py --draft truncated --num-layers 8 --temperature 0

Target: the embedded SmolLM2-135M-Instruct. Draft (--draft auto): the distilled draft when
distributed_spec/models/distilled.py and its bundled checkpoint exist, else the target's first
--num-layers layers (shared weights, untrained, so acceptance is low). All methods decode the same
prompts with the same sampling settings in the same process, after a short warm-up; the output is a
markdown table of tokens/s, speedup over autoregressive, block efficiency and acceptance per position.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

from distributed_spec.engine import EngineConfig, RunStats, SpeculativeEngine
from distributed_spec.models import ModelConfig, ModelSpec, load_pair
from distributed_spec.verify import SamplingParams

logger = logging.getLogger(__name__)

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


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--draft", choices=["auto", "distilled", "truncated"], default="auto")
    parser.add_argument(
        "--distilled-dir", default=None, help="distilled checkpoint (default: the bundled one)"
    )
    parser.add_argument("--num-layers", type=int, default=4, help="layers of the truncated draft")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    # One thread by default: on a small CPU shared with other jobs, multi-threaded small matmuls
    # spin-wait and run 10-100x slower than single-threaded ones.
    parser.add_argument("--num-threads", type=int, default=1)
    parser.add_argument("--methods", default="autoregressive,token,block")
    # The machine may be shared: every method runs --repeats times, interleaved, and its fastest run is kept.
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--stop-at-eos", action="store_true", help="end rows at the tokenizer's EOS")
    return parser.parse_args()


def draft_spec(args: argparse.Namespace) -> ModelSpec:
    """The best draft available: the distilled one when its code and checkpoint exist."""
    truncated = ModelSpec(kind="truncated", num_layers=args.num_layers)
    if args.draft == "truncated":
        return truncated
    checkpoint = Path(args.distilled_dir) if args.distilled_dir else None
    if checkpoint is None:
        try:
            from distributed_spec.models.distilled import DISTILLED_SMOLLM2_DRAFT_DIR

            checkpoint = Path(DISTILLED_SMOLLM2_DRAFT_DIR)
        except ImportError:
            checkpoint = None
    if checkpoint is not None and checkpoint.is_dir():
        return ModelSpec(str(checkpoint), kind="distilled")
    if args.draft == "distilled":
        raise SystemExit(f"--draft distilled: no distilled checkpoint at {checkpoint}")
    logger.warning("no distilled draft found; using the target's first %d layers", args.num_layers)
    return truncated


def table_row(method: str, stats: RunStats, baseline_tokens_per_s: float) -> str:
    acceptance = " ".join(f"{rate:.2f}" for rate in stats.acceptance_per_position) or "-"
    speedup = stats.tokens_per_s / baseline_tokens_per_s if baseline_tokens_per_s else float("nan")
    return (
        f"| {method} | {stats.tokens_per_s:.1f} | {speedup:.2f}x | {stats.block_efficiency:.2f} | "
        f"{stats.num_target_calls} | {stats.num_draft_calls} | {acceptance} | "
        f"{stats.draft_s:.1f} / {stats.target_s:.1f} / {stats.verify_s:.2f} / "
        f"{stats.other_s:.2f} |"
    )


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args()
    torch.set_num_threads(args.num_threads)
    target, draft = load_pair(ModelConfig(draft=draft_spec(args), dtype=args.dtype), args.device)
    tokenizer = target.tokenizer
    questions = [QUESTIONS[index % len(QUESTIONS)] for index in range(args.num_prompts)]
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": question}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
        for question in questions
    ]
    sampling = SamplingParams(temperature=args.temperature)
    eos_token_ids = (tokenizer.eos_token_id,) if args.stop_at_eos else ()
    methods = args.methods.split(",")
    engines = {
        method: SpeculativeEngine(
            target.model,
            draft.model,
            EngineConfig(
                method=method,
                gamma=args.gamma,
                sampling=sampling,
                max_new_tokens=args.max_new_tokens,
                max_batch_size=args.batch_size,
                seed=args.seed,
                eos_token_ids=eos_token_ids,
            ),
            tokenizer=tokenizer,
        )
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
    baseline_tokens_per_s = best["autoregressive"].tokens_per_s if "autoregressive" in best else 0.0
    rows = [table_row(method, best[method], baseline_tokens_per_s) for method in methods]
    print(
        f"\ntarget smollm2, draft {draft.name}, g={args.gamma}, T={args.temperature}, "
        f"{args.num_prompts} prompts x {args.max_new_tokens} new tokens, batch {args.batch_size}, "
        f"device {args.device}, {args.num_threads} thread(s), best of {args.repeats}\n"
    )
    print(
        "| method | tokens/s | speedup | block efficiency | target calls | draft calls | "
        "acceptance per position | draft / target / verify / other s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
