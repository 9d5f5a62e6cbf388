"""The distillation command line: `python -m distributed_spec.distill` (see the package docstring)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import torch

import distributed_spec.distill as package
from distributed_spec.distill.data import DEFAULT_PROMPTS, shard_paths
from distributed_spec.distill.evaluate import run_eval
from distributed_spec.distill.teacher import load_target, run_draft_samples, run_generate, run_questions
from distributed_spec.distill.train import restore_draft, run_train
from distributed_spec.models.distilled import (
    DISTILLED_SMOLLM2_DRAFT_DIR,
    WEIGHT_FORMATS,
    save_distilled_draft,
)
from distributed_spec.models.fetch import cache_dir

logger = logging.getLogger("distributed_spec.distill")


STAGES = ("questions", "generate", "draft-samples", "train", "export", "eval")
DEFAULT_STAGES = ("generate", "train", "export", "eval")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=package.__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2", help='"smollm2" (embedded GGUF), a local model dir or hub id')
    parser.add_argument("--out-dir", default=str(DISTILLED_SMOLLM2_DRAFT_DIR), help="exported draft checkpoint")
    parser.add_argument("--work-dir", default=None, help="shards and training state (default: cache/distill/<out-dir name>)")
    parser.add_argument("--stages", default=",".join(DEFAULT_STAGES), help=f"comma-separated subset of {STAGES}")
    parser.add_argument("--eval-only", action="store_true", help="only the eval stage: print the acceptance of --out-dir")
    parser.add_argument("--resume", action="store_true", help="continue training from work-dir/train_state.pt")
    parser.add_argument("--refresh-sub-vocab", action="store_true",
                        help="on --resume, choose the sub-vocabulary again from all shards (the head is frozen target rows)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    # generate
    parser.add_argument("--prompts", default=str(DEFAULT_PROMPTS))
    parser.add_argument("--samples-per-prompt", type=int, default=3)
    parser.add_argument("--eval-samples-per-prompt", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--gen-batch-size", type=int, default=32)
    parser.add_argument("--store-top-k", type=int, default=64, help="target probabilities kept per position")
    parser.add_argument("--num-questions", type=int, default=0, help="questions stage: user turns the target writes")
    parser.add_argument("--sampler-from", default=None,
                        help="draft-samples stage: the exported draft that writes the text (default: --init-from)")
    parser.add_argument("--score-batch-size", type=int, default=16,
                        help="draft-samples stage: sequences per target scoring forward")
    parser.add_argument("--question-tokens", type=int, default=48, help="questions stage: longest user turn")
    parser.add_argument("--shard-prefix", default="",
                        help="name prefix of new shards, to add a round of samples (with another --seed) to the data")
    # draft architecture
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--intermediate-size", type=int, default=768)
    parser.add_argument("--sub-vocab-size", type=int, default=8192, help="K tokens the draft scores; 0: all V")
    parser.add_argument("--weight-format", choices=WEIGHT_FORMATS, default="bf16",
                        help="export: bf16, or int8 linear weights with per-row scales (half the bytes)")
    parser.add_argument("--init-from", default=None,
                        help="exported draft folder to start training from (same shape), instead of --init-layers")
    parser.add_argument("--init-layers", default="first,last",
                        help='target layers that initialise the draft layers ("first,last", "0,29", or "none")')
    # train
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--tv-weight", type=float, default=0.0,
                        help="loss = (1 - w) * forward KL + w * total variation (1 - acceptance); 0: KL only")
    parser.add_argument("--save-every", type=int, default=100, help="training checkpoint interval (steps)")
    parser.add_argument("--reload-data-every", type=int, default=0,
                        help="re-read the shards every N steps, to train while generate runs in another process; 0: never")
    # eval
    parser.add_argument("--eval-batch-size", type=int, default=4)
    parser.add_argument("--eval-split", choices=["eval", "train"], default="eval",
                        help="held-out sequences, or every 64th training sequence (to compare)")
    parser.add_argument("--bench-tokens", type=int, default=32, help="batch-1 decode steps timed per model; 0: skip")
    args = parser.parse_args(argv)
    args.stages = ["eval"] if args.eval_only else [s for s in args.stages.split(",") if s]
    if "questions" in args.stages and args.num_questions < 1:
        parser.error("--stages questions needs --num-questions > 0")
    if "draft-samples" in args.stages:
        args.sampler_from = args.sampler_from or args.init_from
        if args.sampler_from is None:
            parser.error("--stages draft-samples needs --sampler-from (or --init-from): the draft that writes")
    if not 0.0 <= args.tv_weight <= 1.0:
        parser.error(f"--tv-weight must be in [0, 1], got {args.tv_weight}")
    unknown = set(args.stages) - set(STAGES)
    if unknown:
        parser.error(f"--stages: unknown {sorted(unknown)}; choose from {STAGES}")
    if args.work_dir is None:
        args.work_dir = str(cache_dir() / "distill" / Path(args.out_dir).name)
    return args


def main(argv: list[str] | None = None) -> dict:
    """Run the requested stages; returns the eval metrics (empty when eval is not run)."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    # Denormal floats in the dequantised GGUF weights' activations make CPU matmuls several times slower.
    torch.set_flush_denormal(True)
    torch.manual_seed(args.seed)
    model, tokenizer = load_target(args.target)
    metrics = {}
    if "questions" in args.stages:
        run_questions(args, model, tokenizer)
    if "generate" in args.stages:
        run_generate(args, model, tokenizer)
    if "draft-samples" in args.stages:
        run_draft_samples(args, model, tokenizer)
    if "train" in args.stages:
        draft = run_train(args, model)
    if "export" in args.stages:
        if "train" not in args.stages:
            draft = restore_draft(args, model)
        made_by = " ".join(["python -m distributed_spec.distill", *(argv if argv is not None else sys.argv[1:])])
        save_distilled_draft(draft, args.out_dir, extra_config={"made_by": made_by}, weight_format=args.weight_format)
        logger.info("exported draft to %s", args.out_dir)
    if "eval" in args.stages:
        if not shard_paths(args.work_dir):
            logger.info("no shards under %s: generating the held-out samples first", args.work_dir)
            run_generate(args, model, tokenizer, only_eval=True)
        metrics = run_eval(args, model)
        print(json.dumps(metrics, indent=2))
    return metrics


if __name__ == "__main__":
    main()
