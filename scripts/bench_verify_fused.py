"""python -m scripts.bench_verify_fused [--batch-sizes 1 64 256] [--gammas 4 8] [--vocab-size 128256]
    [--methods block token] [--top-k 0] [--iters 20] [--out bench_verify_fused.md]

Fused Triton verification from logits (distributed_spec.verify.triton_block.verify_fused) against
the torch path (logits_to_probs + verify), on bf16 target logits [B, g+1, V] and fp32 draft
probabilities, as the engine sees them on a GPU. Times are medians of --iters calls after a warm-up
(which compiles the kernels), with torch.cuda.synchronize around each call. The "tau agree" column
is the fraction of rows where both give the same tau for the same uniforms (expect 1.000).

Without CUDA the script falls back to a tiny size in Triton's interpreter (TRITON_INTERPRET=1, set
before triton is imported): a smoke run of the script itself, not a measurement.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import time
from pathlib import Path

import torch

from distributed_spec.verify import SamplingParams, VerifyUniforms, logits_to_probs, verify

TINY = dict(batch_sizes=[2], gammas=[2], vocab_size=64, iters=1, block_size=32)


def _inputs(batch_size: int, gamma: int, vocab_size: int, params: SamplingParams, device: str, generator):
    """bf16 target logits [B, g+1, V], draft ids [B, g] sampled from q, fp32 q [B, g, V], uniforms."""
    target_logits = (
        torch.randn(batch_size, gamma + 1, vocab_size, device=device, generator=generator) * 3
    ).bfloat16()
    draft_logits = target_logits[:, :gamma].float() + torch.randn(
        batch_size, gamma, vocab_size, device=device, generator=generator
    )
    draft_probs = logits_to_probs(draft_logits, params)
    draft_ids = torch.multinomial(draft_probs.view(-1, vocab_size), 1, generator=generator).view(
        batch_size, gamma
    )
    draws = torch.rand(batch_size, gamma + 1, device=device, dtype=torch.float64, generator=generator)
    return target_logits, draft_ids, draft_probs, VerifyUniforms(draws[:, :gamma], draws[:, gamma])


def _median_seconds(fn, iters: int, device: str) -> float:
    fn()  # warm-up: compiles the kernels on first use
    times = []
    for _ in range(iters):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _time_method(triton_block, method: str, inputs, params: SamplingParams, args, device: str) -> str:
    """One table row: torch path, fused, fused with input checks; tau agreement."""
    target_logits, draft_ids, draft_probs, uniforms = inputs
    batch_size, gamma = draft_ids.shape

    def torch_path():
        return verify(method, draft_ids, draft_probs, logits_to_probs(target_logits, params), None, uniforms)

    def fused(check_inputs=False):
        return triton_block.verify_fused(
            method,
            target_logits,
            draft_ids,
            draft_probs,
            None,
            uniforms,
            params,
            block_size=args.block_size,
            check_inputs=check_inputs,
        )

    torch_s = _median_seconds(torch_path, args.iters, device)
    fused_s = _median_seconds(fused, args.iters, device)
    checked_s = _median_seconds(lambda: fused(True), args.iters, device)
    # Host sync: the agreement is a printed number.
    agree = (torch_path().accepted_counts == fused().accepted_counts).double().mean().item()
    return (
        f"| {method} | {batch_size} | {gamma} | {torch_s * 1e3:.3f} | {fused_s * 1e3:.3f} | "
        f"{checked_s * 1e3:.3f} | {torch_s / fused_s:.2f}x | {agree:.3f} |"
    )


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--gammas", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--vocab-size", type=int, default=128256)
    parser.add_argument("--methods", nargs="+", choices=["block", "token"], default=["block", "token"])
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--block-size", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton_block imports triton
        for key, value in TINY.items():
            setattr(args, key, value)
    triton_block = importlib.import_module("distributed_spec.verify.triton_block")
    params = SamplingParams(top_k=args.top_k)
    generator = torch.Generator(device=device).manual_seed(0)
    header = [
        f"Fused Triton vs torch verification on {torch.cuda.get_device_name() if device == 'cuda' else 'CPU (interpreter smoke run)'}: "
        f"V={args.vocab_size}, bf16 logits, fp32 draft probs, top_k={args.top_k}, median of {args.iters} calls (ms)",
        "",
        "| method | B | g | torch ms | fused ms | fused + checks ms | speedup | tau agree |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines = []
    for batch_size in args.batch_sizes:
        for gamma in args.gammas:
            inputs = _inputs(batch_size, gamma, args.vocab_size, params, device, generator)
            for method in args.methods:
                lines.append(_time_method(triton_block, method, inputs, params, args, device))
                print(lines[-1], flush=True)
            del inputs
    table = "\n".join(header + lines)
    print(table)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table + "\n")
    return table


if __name__ == "__main__":
    main()
