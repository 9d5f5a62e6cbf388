"""Single-process engine vs Ray TP = 1 vs Ray TP = 2 on SmolLM2: tokens/s and where an iteration goes.

    .venv/bin/python -m scripts.bench_distributed                       # B in {1, 8}, 32 new tokens, g = 4
    .venv/bin/python -m scripts.bench_distributed --batch-sizes 8 --max-new-tokens 16 --temperature 1
    .venv/bin/python -m scripts.bench_distributed --bytes-only   # q bytes per iteration, V = 128,256, B in {8, 64}
    .venv/bin/python -m scripts.bench_distributed --tp-sizes 2 --verify gather vocab_parallel   # both modes

Target: the embedded SmolLM2-135M-Instruct. Draft (--draft auto): the bundled distilled draft when it
exists, else the target's first --num-layers layers (untrained: low acceptance, but the same shapes
on the wire). Every setup decodes the same prompts with the same settings after a warm-up call.
Ray setups: TP = 1 and TP = 2 target shard groups, each with draft probabilities sent as float32,
bfloat16, and bfloat16 with the next block drafted during verification (overlap); with --verify
vocab_parallel, TP > 1 groups also run parallel.verify=vocab_parallel (float32 and bfloat16 q).

Columns: tokens/s; ms per iteration (one target call); its split into draft (forwards and sampling
on the critical path), transfer (serialisation, object store, scheduling: what is left), target
forward, verification (decode q, verify, broadcast, crop caches), coordinator (its own Python);
"overhead" = transfer + coordinator, the part the goal keeps under 10 % at B = 8; KB of q per
iteration; blocks drafted ahead that were used; whether the tokens equal the engine's.

--bytes-only runs nothing: it computes from the wire encodings (wire.block_wire_bytes) the bytes of
the draft block each iteration sends to shard rank 0 (ids + q) and to every other shard (ids only),
for --vocab-sizes x --batch-sizes at g = --g; with --verify naming both modes, a second table
compares what one iteration moves into and inside a TP = max(--tp-sizes) group under each mode.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from dataclasses import dataclass, replace

import ray
import torch

from distributed_spec.config import ParallelConfig
from distributed_spec.distributed import RayCoordinator
from distributed_spec.distributed.config import VERIFY_MODES
from distributed_spec.distributed.factories import SpecFactory
from distributed_spec.distributed.wire import WIRE_TORCH_DTYPES, WireFormat, block_wire_bytes
from distributed_spec.engine import EngineConfig, SpeculativeEngine
from distributed_spec.engine.config import SamplingConfig, VerifierConfig
from distributed_spec.models import ModelConfig
from distributed_spec.models.loading import load_pair
from scripts.common import QUESTIONS, chat_ids, draft_spec

logger = logging.getLogger(__name__)


@dataclass
class Row:
    setup: str
    batch_size: int
    tokens_per_s: float
    ms_per_iteration: float
    shares: dict[str, float]
    kb_per_iteration: float
    overlap_hits: str
    same_as_engine: str


def bench_engine(engine: SpeculativeEngine, prompts: list[list[int]], batch_size: int) -> tuple[Row, list]:
    config = engine.config
    engine.config = replace(config, sampling=replace(config.sampling, max_new_tokens=2))
    engine.generate(prompts[:batch_size])  # warm-up: first calls allocate and tune kernels
    engine.config = config
    results, stats = engine.generate_with_stats(prompts[:batch_size])
    iterations = max(stats.num_target_calls, 1)
    # The whole run, as the Ray timings (both process the prompts within the first iteration).
    total = max(stats.total_s, 1e-12)
    shares = {
        "draft": stats.draft_s / total,
        "transfer": 0.0,
        "target": stats.target_s / total,
        "verify": stats.verify_s / total,
        "coordinator": stats.other_s / total,
    }
    row = Row(
        "engine (1 process)", batch_size, stats.tokens_per_s, 1000 * total / iterations, shares, 0.0, "-", "-"
    )
    return row, results


def bench_ray(
    coordinator: RayCoordinator, runtime: ParallelConfig, label: str, prompts: list[list[int]], batch_size: int,
    reference: list,
) -> Row:
    coordinator.runtime = runtime
    config = coordinator.config
    coordinator.config = replace(config, sampling=replace(config.sampling, max_new_tokens=2))
    coordinator.generate(prompts[:batch_size])  # warm-up: first calls allocate and tune kernels
    coordinator.config = config
    start = time.perf_counter()
    results, stats = coordinator.generate_with_stats(prompts[:batch_size])
    elapsed = time.perf_counter() - start
    timings = coordinator.timings
    iterations = max(timings.num_iterations, 1)
    same = [r.token_ids for r in results] == [r.token_ids for r in reference]
    return Row(
        setup=label,
        batch_size=batch_size,
        tokens_per_s=stats.num_tokens / elapsed,
        ms_per_iteration=1000 * timings.iteration_s / iterations,
        shares=timings.fractions(),
        kb_per_iteration=timings.num_wire_bytes / iterations / 1024,
        overlap_hits=f"{timings.num_overlap_hits}/{timings.num_iterations}" if runtime.overlap else "-",
        same_as_engine="yes" if same else "no",
    )


def markdown(rows: list[Row]) -> str:
    lines = [
        "| setup | B | tokens/s | ms/iter | draft | transfer | target fwd | verify | coordinator | overhead "
        "| q KB/iter | overlap hits | same tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        share = row.shares
        overhead = share["transfer"] + share["coordinator"]
        lines.append(
            f"| {row.setup} | {row.batch_size} | {row.tokens_per_s:.1f} | {row.ms_per_iteration:.0f} "
            f"| {share['draft']:.0%} | {share['transfer']:.0%} | {share['target']:.0%} | {share['verify']:.0%} "
            f"| {share['coordinator']:.0%} | {overhead:.0%} | {row.kb_per_iteration:.0f} | {row.overlap_hits} "
            f"| {row.same_as_engine} |"
        )
    return "\n".join(lines)


def bytes_table(vocab_sizes: list[int], batch_sizes: list[int], g: int, top_k: int) -> str:
    """Markdown: the draft block's bytes per iteration for each wire encoding (computed, not measured)."""
    encodings = [
        ("float32 (CPU default)", WireFormat("float32")),
        ("bfloat16 (cuda default)", WireFormat("bfloat16")),
        ("float16", WireFormat("float16")),
        (f"top-{top_k}, bfloat16 values + int32 ids", WireFormat("bfloat16", top_k=top_k)),
        ("greedy verification (no q)", WireFormat(send_probs=False)),
    ]
    lines = [
        "| wire | V | B | g | bytes to rank 0 / iteration | MB | bytes to each other shard |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for vocab_size in vocab_sizes:
        for batch_size in batch_sizes:
            ids_only = block_wire_bytes(batch_size, g, vocab_size, WireFormat(send_probs=False))
            for label, wire in encodings:
                total = block_wire_bytes(batch_size, g, vocab_size, wire)
                lines.append(
                    f"| {label} | {vocab_size:,} | {batch_size} | {g} | {total:,} | {total / 1e6:.2f} "
                    f"| {ids_only:,} |"
                )
    return "\n".join(lines)


def verify_bytes(vocab_size: int, batch_size: int, g: int, tp_size: int, wire: WireFormat,
                 logit_bytes: int, mode: str) -> dict[str, int]:
    """Bytes one iteration moves under parallel.verify=mode (computed from the shapes, not measured).

    q: the draft block into the group (all shards together); head: what each rank receives in the
    LM head's all-reduce of the [B, g+1, V] logits (AutoTP's hidden-sharded head; gather only);
    verify: what each rank receives in verification's own collectives (ring all-reduce: 2 (tp-1)/tp
    of the tensor, all-gather: tp-1 chunks), the collectives of verify_parallel/vocab_parallel.py.
    """
    ids = block_wire_bytes(batch_size, g, vocab_size, WireFormat(send_probs=False))
    if mode == "gather":
        head = 2 * (tp_size - 1) * batch_size * (g + 1) * vocab_size * logit_bytes // tp_size
        q = block_wire_bytes(batch_size, g, vocab_size, wire) + (tp_size - 1) * ids
        return {"q": q, "head": head, "verify": 2 * (tp_size - 1) * 2 * batch_size * 8 // tp_size}
    sliced = replace(wire, vocab_shards=tp_size)
    dense = sliced.send_probs and not 0 < wire.top_k < vocab_size
    if dense:  # each shard: ids + its slice of q (+ the rows' sums when q is renormalised)
        value_bytes = torch.empty(0, dtype=WIRE_TORCH_DTYPES[wire.dtype]).element_size()
        sums = batch_size * g * 4 if wire.dtype != "float32" else 0
        q = tp_size * (ids + sums) + batch_size * g * vocab_size * value_bytes
    else:  # top-k or no q: the block goes whole to every shard
        q = tp_size * block_wire_bytes(batch_size, g, vocab_size, wire)
    if not wire.send_probs:  # greedy: an all-reduce MAX and MIN of [B, g+1]
        collectives = 2 * (tp_size - 1) * batch_size * (g + 1) * (4 + 8) // tp_size
    else:  # statistics [B, 5g+2] float32 and masses [B, 2g+1] float64 all-gathered, Y all-reduced
        collectives = (tp_size - 1) * batch_size * ((5 * g + 2) * 4 + (2 * g + 1) * 8)
        collectives += 2 * (tp_size - 1) * batch_size * 8 // tp_size
    return {"q": q, "head": 0, "verify": collectives}


def verify_bytes_table(vocab_sizes: list[int], batch_sizes: list[int], g: int, tp_size: int,
                       modes: list[str], logit_bytes: int = 2) -> str:
    """Markdown: bytes per iteration of each parallel.verify mode (bfloat16 q, bfloat16 logits)."""
    encodings = [("bfloat16 q", WireFormat("bfloat16")), ("greedy (no q)", WireFormat(send_probs=False))]
    lines = [
        "| parallel.verify | wire | V | B | g | TP | q into the group | LM-head all-reduce / rank "
        "| verify collectives / rank | total MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for vocab_size in vocab_sizes:
        for batch_size in batch_sizes:
            for label, wire in encodings:
                for mode in modes:
                    moved = verify_bytes(vocab_size, batch_size, g, tp_size, wire, logit_bytes, mode)
                    total = moved["q"] + tp_size * (moved["head"] + moved["verify"])
                    lines.append(
                        f"| {mode} | {label} | {vocab_size:,} | {batch_size} | {g} | {tp_size} | {moved['q']:,} "
                        f"| {moved['head']:,} | {moved['verify']:,} | {total / 1e6:.2f} |"
                    )
    return "\n".join(lines)


def ray_variants(runtime: ParallelConfig, verify_modes: list[str]) -> list[tuple[str, ParallelConfig]]:
    """The Ray setups of one TP size: each wire variant per verification mode (vocab_parallel: TP > 1)."""
    variants = []
    if "gather" in verify_modes:
        variants += [("float32 q", runtime), ("bfloat16 q", replace(runtime, wire_dtype="bfloat16")),
                     ("bf16 q + overlap", replace(runtime, wire_dtype="bfloat16", overlap=True))]
    if "vocab_parallel" in verify_modes and runtime.tp_size > 1:
        vocab = replace(runtime, verify="vocab_parallel")
        variants += [("float32 q, vocab_parallel", vocab),
                     ("bfloat16 q, vocab_parallel", replace(vocab, wire_dtype="bfloat16"))]
    return variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--batch-sizes", type=int, nargs="+", default=None, help="default: 1 8 (timing), 8 64 (--bytes-only)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--num-draft-tokens", "--gamma", type=int, default=4)
    parser.add_argument("--method", default="block", choices=["block", "token", "greedy"])
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--draft", default="auto", choices=["auto", "distilled", "truncated"])
    parser.add_argument("--num-layers", type=int, default=4, help="layers of the truncated draft")
    parser.add_argument("--tp-sizes", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--num-cpus",
        type=float,
        default=float(os.cpu_count() or 2),
        help="CPUs given to the target group (split among shards) and to the draft",
    )
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    parser.add_argument("--bytes-only", action="store_true", help="print the wire bytes table and exit")
    parser.add_argument("--vocab-sizes", type=int, nargs="+", default=[128_256], help="--bytes-only")
    parser.add_argument("--top-k", type=int, default=64, help="--bytes-only: the top-k encoding's k")
    parser.add_argument("--verify", nargs="+", default=["gather"], choices=list(VERIFY_MODES),
                        help="parallel.verify modes to run (vocab_parallel: TP > 1 only)")
    args = parser.parse_args()
    if args.bytes_only:
        print(bytes_table(args.vocab_sizes, args.batch_sizes or [8, 64], args.num_draft_tokens, args.top_k))
        if len(args.verify) > 1:
            print()
            print(verify_bytes_table(args.vocab_sizes, args.batch_sizes or [8, 64], args.num_draft_tokens,
                                     max(max(args.tp_sizes), 2), args.verify))
        return
    args.batch_sizes = args.batch_sizes or [1, 8]
    logging.basicConfig(level=logging.WARNING)

    pair = ModelConfig(draft=draft_spec(args.draft, args.num_layers))
    target, draft = load_pair(pair)
    tokenizer = target.tokenizer
    prompts = [chat_ids(tokenizer, [{"role": "user", "content": question}]) for question in QUESTIONS]
    while len(prompts) < max(args.batch_sizes):
        prompts += prompts
    config = EngineConfig(
        verifier=VerifierConfig(method=args.method, num_draft_tokens=args.num_draft_tokens),
        sampling=SamplingConfig(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=0),
        max_batch_size=max(args.batch_sizes),
    )
    print(
        f"target smollm2, draft {draft.name}, method {args.method}, g = {args.num_draft_tokens}, T = {args.temperature}, "
        f"{args.max_new_tokens} new tokens, torch threads {torch.get_num_threads()}"
    )

    rows: list[Row] = []
    engine = SpeculativeEngine(target.model, draft.model, config)
    references = {}
    for batch_size in args.batch_sizes:
        row, references[batch_size] = bench_engine(engine, prompts, batch_size)
        rows.append(row)
        print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    del engine, target, draft

    ray.init(num_cpus=int(2 * args.num_cpus), include_dashboard=False, log_to_driver=False)
    try:
        for tp_size in args.tp_sizes:
            runtime = ParallelConfig(
                runtime="ray", device="cpu", backend="gloo", tp_size=tp_size, num_cpus_per_shard=args.num_cpus / tp_size, num_cpus_draft=args.num_cpus,
                load_timeout_s=900, step_timeout_s=300, wire_dtype="float32",
            )
            variants = ray_variants(runtime, args.verify)
            start = time.perf_counter()
            with RayCoordinator(*SpecFactory.for_pair(pair, "cpu"), config, runtime) as coordinator:
                print(f"Ray TP = {tp_size} up in {time.perf_counter() - start:.0f} s", flush=True)
                for batch_size in args.batch_sizes:
                    for label, variant in variants:
                        rows.append(
                            bench_ray(
                                coordinator,
                                variant,
                                f"Ray TP={tp_size}, {label}",
                                prompts,
                                batch_size,
                                references[batch_size],
                            )
                        )
                        print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    finally:
        ray.shutdown()
    rows.sort(key=lambda row: row.batch_size)
    print()
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([row.__dict__ for row in rows], handle, indent=1)


if __name__ == "__main__":
    main()
