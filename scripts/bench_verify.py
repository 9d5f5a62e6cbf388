"""Time verification implementations on this machine: the torch rules, the fused Triton kernel, the
vocabulary-parallel path.

    python -m scripts.bench_verify                                   # torch: token vs block vs greedy, the full grid
    python -m scripts.bench_verify --batch-sizes 1 --num-draft-tokens 4 --vocab-sizes 49152 --iters 5
    python -m scripts.bench_verify --impl triton --out triton.md     # fused kernel vs the torch path
    python -m scripts.bench_verify --impl vocab_parallel --tp-sizes 2 4
    python -m scripts.bench_verify --impl torch triton vocab_parallel --batch-sizes 1 32 --num-draft-tokens 4 \\
        --vocab-sizes 128256                                          # side by side

--impl names one or more implementations; each prints its own table, and with several a last table
sets their time per verification step from logits side by side wherever they measured the same
(method, B, g, V). Grid flags left out take each implementation's defaults (DEFAULTS below).

torch (distributed_spec.verify): one `verify(...)` call from probabilities (what the rule itself
costs) and one step from target logits (the softmax of the target's g+1 positions included: what the
engine pays per iteration), fastest of --iters calls. Block verification needs one more reduction over
V per draft position than token verification; the ratio columns show what that costs. Inputs: target
logits 3 N(0, 1), draft logits = target + N(0, 1).

triton (distributed_spec.verify.triton_block.verify_fused) against the torch path (logits_to_probs +
verify), on bf16 target logits [B, g+1, V] and fp32 draft probabilities, as the engine sees them on a
GPU: medians of --iters calls after a warm-up (which compiles the kernels), synchronised around each
call; "tau agree" is the fraction of rows where both give the same tau for the same uniforms (expect
1.000). Without CUDA it falls back to a tiny size in Triton's interpreter (TRITON_INTERPRET=1, set
before triton is imported): a smoke run of the script itself, not a measurement.

vocab_parallel (distributed_spec.verify_parallel) against gather-then-verify (gather every shard's
logits to rank 0, run the torch reference there, broadcast tau and Y), on gloo CPU process groups of
tp processes (torch.multiprocessing, one thread each): the fastest of --iters calls, wall time on rank
0 between barriers (so the slowest rank counts), and bytes moved between processes per iteration:
- collectives: bytes received, summed over ranks (ring all-reduce 2 (tp-1)/tp of the tensor per
  rank, all-gather (tp-1) chunks, gather (tp-1) shards into rank 0, broadcast 1 copy per rank);
- inbound of the busiest rank, counting also the draft probabilities the coordinator sends it:
  all of q [B, g, V] to the verifying rank 0 for gather-then-verify, a [B, g, V/tp] slice to each
  rank for the vocabulary-parallel path (modelled from the sizes, not sent here).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import os
import socket
import statistics
import time
from pathlib import Path

import torch

from distributed_spec.verify import SamplingParams, VerifyUniforms, draw_uniforms, logits_to_probs, verify
from scripts.common import human_bytes, markdown_table, time_calls

IMPLS = ("torch", "triton", "vocab_parallel")
# Each implementation's grid when its flags are left out.
DEFAULTS = {
    "torch": dict(batch_sizes=[1, 32], num_draft_tokens=[4, 8], vocab_sizes=[49152, 128256], iters=9,
                  methods=["token", "block", "greedy"]),
    "triton": dict(batch_sizes=[1, 64, 256], num_draft_tokens=[4, 8], vocab_sizes=[128256], iters=20, methods=["block", "token"]),
    "vocab_parallel": dict(batch_sizes=[1, 32, 128], num_draft_tokens=[4, 8], vocab_sizes=[128256], iters=5, methods=["block"]),
}
# The triton smoke run without CUDA (Triton's interpreter is slow: tiny sizes only).
TRITON_INTERPRETER_GRID = dict(batch_sizes=[2], num_draft_tokens=[2], vocab_sizes=[64], iters=1, block_size=32)
FLOAT_BYTES = 4

# A side-by-side cell: (method, B, g, V) -> {column label: seconds}.
Comparable = dict[tuple[str, int, int, int], dict[str, float]]


def settings(args: argparse.Namespace, impl: str) -> argparse.Namespace:
    """args with impl's defaults where a grid flag was left out."""
    merged = argparse.Namespace(**vars(args))
    for key, value in DEFAULTS[impl].items():
        if getattr(merged, key) is None:
            setattr(merged, key, value)
    return merged


# ----------------------------------------------------------------------------- torch


def torch_point(batch_size: int, g: int, vocab_size: int, methods: list[str], iters: int) -> dict[str, float]:
    """Seconds per call of each method from probabilities, and of token/block from logits."""
    generator = torch.Generator().manual_seed(0)
    target_logits = torch.randn(batch_size, g + 1, vocab_size, generator=generator) * 3
    draft_logits = target_logits[:, :g] + torch.randn(batch_size, g, vocab_size, generator=generator)
    params = SamplingParams(temperature=1.0)
    draft_probs = logits_to_probs(draft_logits, params)
    draft_ids = torch.multinomial(draft_probs.view(-1, vocab_size), 1, generator=generator).view(batch_size, g)
    target_probs = logits_to_probs(target_logits, params)
    uniforms = draw_uniforms(batch_size, g, generator)
    calls = {}
    for method in methods:
        calls[method] = lambda m=method: verify(m, draft_ids, draft_probs, target_probs, None, uniforms)
        calls[f"{method}_from_logits"] = lambda m=method: verify(
            m, draft_ids, draft_probs, logits_to_probs(target_logits, params), None, uniforms
        )
    return time_calls(calls, iters)


def run_torch(args: argparse.Namespace) -> tuple[str, Comparable]:
    torch.set_num_threads(args.threads)
    sampled = [m for m in args.methods if m != "greedy"]  # the from-logits columns (greedy's is not shown)
    ratio = "block" in args.methods and "token" in args.methods
    columns = ["B", "g", "V", *args.methods, *(["block/token"] if ratio else [])]
    columns += [f"{m} (from logits)" for m in sampled] + (["block/token (from logits)"] if ratio else [])
    rows, comparable = [], {}
    for batch_size, g, vocab_size in itertools.product(args.batch_sizes, args.num_draft_tokens, args.vocab_sizes):
        t = {k: v * 1e6 for k, v in torch_point(batch_size, g, vocab_size, args.methods, args.iters).items()}
        row = [batch_size, g, vocab_size, *(f"{t[m]:.0f}" for m in args.methods)]
        row += [f"{t['block'] / t['token']:.2f}"] if ratio else []
        row += [f"{t[f'{m}_from_logits']:.0f}" for m in sampled]
        row += [f"{t['block_from_logits'] / t['token_from_logits']:.2f}"] if ratio else []
        rows.append(row)
        print(markdown_table(columns, [row]).splitlines()[-1], flush=True)
        for method in args.methods:
            comparable[(method, batch_size, g, vocab_size)] = {"torch (min)": t[f"{method}_from_logits"] / 1e6}
    title = (f"torch {torch.__version__}, {args.threads} threads, best of {args.iters} calls, microseconds per call; "
             "from logits: the target's softmax included")
    return title + "\n\n" + markdown_table(columns, rows), comparable


# ----------------------------------------------------------------------------- triton


def triton_inputs(batch_size: int, g: int, vocab_size: int, params: SamplingParams, device: str, generator):
    """bf16 target logits [B, g+1, V], draft ids [B, g] sampled from q, fp32 q [B, g, V], uniforms."""
    target_logits = (torch.randn(batch_size, g + 1, vocab_size, device=device, generator=generator) * 3).bfloat16()
    draft_logits = target_logits[:, :g].float() + torch.randn(
        batch_size, g, vocab_size, device=device, generator=generator
    )
    draft_probs = logits_to_probs(draft_logits, params)
    draft_ids = torch.multinomial(draft_probs.view(-1, vocab_size), 1, generator=generator).view(batch_size, g)
    draws = torch.rand(batch_size, g + 1, device=device, dtype=torch.float64, generator=generator)
    return target_logits, draft_ids, draft_probs, VerifyUniforms(draws[:, :g], draws[:, g])


def triton_point(triton_block, method: str, inputs, params: SamplingParams, args, sync) -> tuple[dict, float]:
    """Median seconds of the torch path, fused, fused with input checks; and the tau agreement."""
    target_logits, draft_ids, draft_probs, uniforms = inputs

    def torch_path():
        return verify(method, draft_ids, draft_probs, logits_to_probs(target_logits, params), None, uniforms)

    def fused(check_inputs=False):
        return triton_block.verify_fused(method, target_logits, draft_ids, draft_probs, None, uniforms, params,
                                         block_size=args.block_size, check_inputs=check_inputs)

    times = time_calls({"torch": torch_path, "fused": fused, "checked": lambda: fused(check_inputs=True)},
                       args.iters, reduce=statistics.median, sync=sync)
    # Host sync: the agreement is a printed number.
    agree = (torch_path().accepted_counts == fused().accepted_counts).double().mean().item()
    return times, agree


def run_triton(args: argparse.Namespace) -> tuple[str, Comparable]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton_block imports triton
        for key, value in TRITON_INTERPRETER_GRID.items():
            setattr(args, key, value)
    triton_block = importlib.import_module("distributed_spec.verify.triton_block")
    params = SamplingParams(top_k=args.top_k)
    generator = torch.Generator(device=device).manual_seed(0)
    sync = torch.cuda.synchronize if device == "cuda" else None
    methods = [m for m in args.methods if m != "greedy"]  # the kernel does block and token verification
    columns = ["method", "B", "g", "V", "torch ms", "fused ms", "fused + checks ms", "speedup", "tau agree"]
    rows, comparable = [], {}
    for batch_size, g, vocab_size in itertools.product(args.batch_sizes, args.num_draft_tokens, args.vocab_sizes):
        inputs = triton_inputs(batch_size, g, vocab_size, params, device, generator)
        for method in methods:
            t, agree = triton_point(triton_block, method, inputs, params, args, sync)
            rows.append([method, batch_size, g, vocab_size, f"{t['torch'] * 1e3:.3f}", f"{t['fused'] * 1e3:.3f}",
                         f"{t['checked'] * 1e3:.3f}", f"{t['torch'] / t['fused']:.2f}x", f"{agree:.3f}"])
            print(markdown_table(columns, [rows[-1]]).splitlines()[-1], flush=True)
            comparable[(method, batch_size, g, vocab_size)] = {"triton fused (median)": t["fused"]}
        del inputs  # free the device memory before the next size
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU (interpreter smoke run)"
    title = (f"Fused Triton vs torch verification on {where}: bf16 logits, fp32 draft probs, top_k={args.top_k}, "
             f"median of {args.iters} calls (ms)")
    return title + "\n\n" + markdown_table(columns, rows, align="lrrrrrrrr"), comparable


# ----------------------------------------------------------------------------- vocab_parallel


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parallel_inputs(batch_size: int, g: int, shard, full_draft: bool):
    """Seeded per configuration: the same draft ids and uniforms on every rank, this rank's logits.

    Returns target_logits [B, g+1, V/tp], draft_ids [B, g], draft_probs [B, g, V/tp] (or [B, g, V]
    on rank 0 when full_draft), uniforms.
    """
    common = torch.Generator().manual_seed(1000 * batch_size + g)
    draft_ids = torch.randint(0, shard.vocab_size, (batch_size, g), generator=common)
    eta = torch.rand(batch_size, g, generator=common, dtype=torch.float64)
    u = torch.rand(batch_size, generator=common, dtype=torch.float64)
    local = torch.Generator().manual_seed(7 + shard.rank)
    target_logits = torch.randn(batch_size, g + 1, shard.num_ids, generator=local) * 3
    draft_width = shard.vocab_size if full_draft else shard.num_ids
    # q of mass about 1 over V: the rule's work does not depend on its shape.
    draft_probs = torch.rand(batch_size, g, draft_width, generator=local).mul_(2.0 / shard.vocab_size)
    return target_logits, draft_ids, draft_probs, VerifyUniforms(eta, u)


def gather_then_verify(method, target_logits, draft_ids, draft_probs, uniforms, params, shard) -> int:
    """Rank 0 gathers the logits, runs the reference, broadcasts [tau | Y]; returns bytes received by this rank."""
    import torch.distributed as dist

    received = 0
    if shard.rank == 0:
        parts = [torch.empty(target_logits.shape[0], target_logits.shape[1], shard.max_shard_size)
                 for _ in range(shard.world_size)]
        dist.gather(target_logits, parts, dst=0)
        received += (shard.world_size - 1) * target_logits.numel() * FLOAT_BYTES
        full_logits = torch.cat(parts, dim=-1)[..., : shard.vocab_size]
        output = verify(method, draft_ids, draft_probs, logits_to_probs(full_logits, params), None, uniforms)
        result = torch.cat([output.accepted_counts, output.next_tokens])
    else:
        dist.gather(target_logits, None, dst=0)
        result = torch.empty(2 * draft_ids.shape[0], dtype=torch.long)
        received += result.numel() * 8
    dist.broadcast(result, src=0)
    return received


def _timed_collective(fn, iters: int) -> tuple[float, int]:
    """Fastest seconds per call (rank 0, between barriers) and bytes received per call, summed over ranks."""
    import torch.distributed as dist

    fn()  # warm-up
    times, received = [], []
    for _ in range(iters):
        dist.barrier()
        start = time.perf_counter()
        received.append(fn())
        dist.barrier()
        times.append(time.perf_counter() - start)
    total = torch.tensor([received[-1]], dtype=torch.long)
    dist.all_reduce(total)
    return min(times), int(total.item())


def parallel_config(method: str, batch_size: int, g: int, shard, params: SamplingParams, iters: int) -> dict:
    """Both paths at one (method, B, g, V); every rank calls it, rank 0's row is the result."""
    from distributed_spec.verify_parallel import verify_vocab_parallel

    target_logits, draft_ids, draft_probs, uniforms = parallel_inputs(batch_size, g, shard, full_draft=False)

    def parallel():
        shard.bytes_received = 0
        verify_vocab_parallel(method, target_logits, draft_ids, draft_probs, None, uniforms, params, shard)
        return shard.bytes_received

    parallel_s, parallel_bytes = _timed_collective(parallel, iters)
    full_draft = parallel_inputs(batch_size, g, shard, full_draft=True)[2] if shard.rank == 0 else None
    gather_s, gather_bytes = _timed_collective(
        lambda: gather_then_verify(method, target_logits, draft_ids, full_draft, uniforms, params, shard), iters
    )
    tp_size = shard.world_size
    return dict(
        method=method, tp=tp_size, B=batch_size, g=g, V=shard.vocab_size,
        gather_s=gather_s, parallel_s=parallel_s, gather_bytes=gather_bytes, parallel_bytes=parallel_bytes,
        # Busiest rank: rank 0 receives every other shard's logits and all of q.
        gather_inbound=batch_size * g * shard.vocab_size * FLOAT_BYTES
        + (tp_size - 1) * batch_size * (g + 1) * shard.max_shard_size * FLOAT_BYTES,
        # Every rank: its q slice and its share of the collectives (they are symmetric).
        parallel_inbound=batch_size * g * shard.max_shard_size * FLOAT_BYTES + parallel_bytes // tp_size,
    )


def _parallel_worker(rank: int, tp_size: int, port: int, grid: dict, results) -> None:
    import torch.distributed as dist

    from distributed_spec.verify_parallel import VocabShard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=tp_size)
    params = SamplingParams()
    for vocab_size in grid["vocab_sizes"]:
        shard = VocabShard(vocab_size)
        for method, batch_size, g in itertools.product(grid["methods"], grid["batch_sizes"], grid["num_draft_tokens"]):
            row = parallel_config(method, batch_size, g, shard, params, grid["iters"])
            if rank == 0:
                results.put(row)
    dist.destroy_process_group()


def run_vocab_parallel(args: argparse.Namespace) -> tuple[str, Comparable]:
    import torch.multiprocessing as mp

    methods = [m for m in args.methods if m != "greedy"]
    grid = dict(vocab_sizes=args.vocab_sizes, methods=methods, batch_sizes=args.batch_sizes, num_draft_tokens=args.num_draft_tokens,
                iters=args.iters)
    context = mp.get_context("spawn")
    rows = []
    for tp_size in args.tp_sizes:
        results = context.Queue()
        port = _free_port()
        processes = [context.Process(target=_parallel_worker, args=(rank, tp_size, port, grid, results))
                     for rank in range(tp_size)]
        for process in processes:
            process.start()
        expected = len(args.vocab_sizes) * len(methods) * len(args.batch_sizes) * len(args.num_draft_tokens)
        rows.extend(results.get(timeout=3600) for _ in range(expected))
        for process in processes:
            process.join()
            if process.exitcode != 0:
                raise RuntimeError(f"a tp={tp_size} worker exited with {process.exitcode}")
    columns = ["method", "tp", "B", "g", "V", "gather+verify ms", "vocab-parallel ms", "time ratio",
               "collective bytes gather", "collective bytes parallel", "busiest-rank inbound gather (incl. q)",
               "busiest-rank inbound parallel (incl. q)", "inbound ratio"]
    table_rows, comparable = [], {}
    for r in rows:
        table_rows.append([
            r["method"], r["tp"], r["B"], r["g"], r["V"], f"{r['gather_s'] * 1e3:.1f}", f"{r['parallel_s'] * 1e3:.1f}",
            f"{r['gather_s'] / r['parallel_s']:.2f}x", human_bytes(r["gather_bytes"]), human_bytes(r["parallel_bytes"]),
            human_bytes(r["gather_inbound"]), human_bytes(r["parallel_inbound"]),
            f"{r['gather_inbound'] / r['parallel_inbound']:.1f}x",
        ])
        cell = comparable.setdefault((r["method"], r["B"], r["g"], r["V"]), {})
        cell[f"vocab_parallel tp={r['tp']} (min)"] = r["parallel_s"]
        cell[f"gather+verify tp={r['tp']} (min)"] = r["gather_s"]
    title = (f"Vocabulary-parallel vs gather-then-verify, fp32 logits, gloo on CPU, fastest of {args.iters} calls (ms); "
             "bytes per iteration")
    return title + "\n\n" + markdown_table(columns, table_rows, align="l" + "r" * 12), comparable


# ----------------------------------------------------------------------------- side by side

RUNNERS = {"torch": run_torch, "triton": run_triton, "vocab_parallel": run_vocab_parallel}


def side_by_side(comparables: list[Comparable]) -> str | None:
    """ms per verification step from logits at the (method, B, g, V) that more than one implementation
    measured; each column keeps its own statistic (in its label). None when nothing is shared."""
    keys = sorted(set.union(*(set(c) for c in comparables)))
    shared = [k for k in keys if sum(k in c for c in comparables) > 1]
    if not shared:
        return None
    labels = list(dict.fromkeys(label for c in comparables for k in shared for label in c.get(k, {})))
    rows = []
    for key in shared:
        cells = {label: seconds for c in comparables for label, seconds in c.get(key, {}).items()}
        rows.append([*key, *(f"{cells[label] * 1e3:.3f}" if label in cells else "-" for label in labels)])
    title = "Side by side: ms per verification step from target logits"
    return title + "\n\n" + markdown_table(["method", "B", "g", "V", *labels], rows, align="lrrr" + "r" * len(labels))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", nargs="+", choices=IMPLS, default=["torch"], help="implementations to time")
    grid = parser.add_argument_group("grid (left out: each implementation's DEFAULTS)")
    grid.add_argument("--batch-sizes", "--batch", type=int, nargs="+", default=None)
    grid.add_argument("--num-draft-tokens", "--gammas", "--gamma", type=int, nargs="+", default=None, help="draft tokens per row")
    grid.add_argument("--vocab-sizes", "--vocab", "--vocab-size", type=int, nargs="+", default=None)
    grid.add_argument("--methods", "--method", nargs="+", choices=["token", "block", "greedy"], default=None,
                      help="verification rules (triton and vocab_parallel: block and token)")
    grid.add_argument("--iters", "--repeats", type=int, default=None, help="timed calls per point")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch: CPU threads")
    parser.add_argument("--top-k", type=int, default=0, help="triton: the sampling top-k")
    parser.add_argument("--block-size", type=int, default=4096, help="triton: the kernel's block over V")
    parser.add_argument("--tp-sizes", type=int, nargs="+", default=[2, 4], help="vocab_parallel: process group sizes")
    parser.add_argument("--out", type=Path, default=None, help="also write the tables to this markdown file")
    args = parser.parse_args(argv)
    if "vocab_parallel" in args.impl and any(tp < 2 for tp in args.tp_sizes):
        parser.error("--tp-sizes must be >= 2")
    args.impl = list(dict.fromkeys(args.impl))
    return args


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    tables, comparables = [], []
    for impl in args.impl:
        table, comparable = RUNNERS[impl](settings(args, impl))
        print("\n" + table + "\n", flush=True)
        tables.append(table)
        comparables.append(comparable)
    if len(comparables) > 1:
        combined = side_by_side(comparables)
        if combined:
            print(combined)
            tables.append(combined)
    text = "\n\n".join(tables) + "\n"
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return text


if __name__ == "__main__":
    main()
