"""python -m scripts.bench_verify_parallel [--vocab-size 128256] [--batch-sizes 1 32 128] [--gammas 4 8]
    [--tp-sizes 2 4] [--iters 5] [--method block] [--out bench_verify_parallel.md]

Vocabulary-parallel block verification (distributed_spec.verify_parallel) against gather-then-verify
(gather every shard's logits to rank 0, run the torch reference there, broadcast tau and Y), on gloo
CPU process groups of tp processes (torch.multiprocessing, one thread each).

Per configuration: the fastest of --iters calls after a warm-up (the least disturbed by other load
on a shared machine), wall time on rank 0 between barriers (so the slowest rank counts); and bytes
moved between processes per iteration:
- collectives: bytes received, summed over ranks (ring all-reduce 2 (tp-1)/tp of the tensor per
  rank, all-gather (tp-1) chunks, gather (tp-1) shards into rank 0, broadcast 1 copy per rank);
- inbound of the busiest rank, counting also the draft probabilities the coordinator sends it:
  all of q [B, g, V] to the verifying rank 0 for gather-then-verify, a [B, g, V/tp] slice to each
  rank for the vocabulary-parallel path (modelled from the sizes, not sent here).
Prints a markdown table (and writes it to --out).
"""

from __future__ import annotations

import argparse
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from distributed_spec.verify import SamplingParams, VerifyUniforms, logits_to_probs, verify
from distributed_spec.verify_parallel import VocabShard, verify_vocab_parallel

FLOAT_BYTES = 4


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _inputs(batch_size: int, gamma: int, shard: VocabShard, full_draft: bool):
    """Seeded per configuration: the same draft ids and uniforms on every rank, this rank's logits.

    Returns target_logits [B, g+1, V/tp], draft_ids [B, g], draft_probs [B, g, V/tp] (or [B, g, V]
    on rank 0 when full_draft), uniforms.
    """
    common = torch.Generator().manual_seed(1000 * batch_size + gamma)
    draft_ids = torch.randint(0, shard.vocab_size, (batch_size, gamma), generator=common)
    eta, u = (
        torch.rand(batch_size, gamma, generator=common, dtype=torch.float64),
        torch.rand(batch_size, generator=common, dtype=torch.float64),
    )
    local = torch.Generator().manual_seed(7 + shard.rank)
    target_logits = torch.randn(batch_size, gamma + 1, shard.num_ids, generator=local) * 3
    draft_width = shard.vocab_size if full_draft else shard.num_ids
    # q of mass about 1 over V: the rule's work does not depend on its shape.
    draft_probs = torch.rand(batch_size, gamma, draft_width, generator=local).mul_(2.0 / shard.vocab_size)
    return target_logits, draft_ids, draft_probs, VerifyUniforms(eta, u)


def _gather_then_verify(method, target_logits, draft_ids, draft_probs, uniforms, params, shard) -> int:
    """Rank 0 gathers the logits, runs the reference, broadcasts [tau | Y]; returns bytes received
    by this rank."""
    received = 0
    if shard.rank == 0:
        parts = [
            torch.empty(target_logits.shape[0], target_logits.shape[1], shard.max_shard_size)
            for _ in range(shard.world_size)
        ]
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


def _timed(fn, iters: int) -> tuple[float, int]:
    """Fastest seconds per call (rank 0, between barriers) and bytes received per call, summed over ranks."""
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


def _time_config(batch_size: int, gamma: int, shard: VocabShard, params: SamplingParams, args) -> dict:
    """Both paths at one (B, g); every rank calls it, rank 0's row is the result."""
    target_logits, draft_ids, draft_probs, uniforms = _inputs(batch_size, gamma, shard, full_draft=False)

    def parallel():
        shard.bytes_received = 0
        verify_vocab_parallel(
            args.method, target_logits, draft_ids, draft_probs, None, uniforms, params, shard
        )
        return shard.bytes_received

    parallel_s, parallel_bytes = _timed(parallel, args.iters)
    full_draft = None
    if shard.rank == 0:  # only the verifying rank holds all of q
        full_draft = _inputs(batch_size, gamma, shard, full_draft=True)[2]
    gather_s, gather_bytes = _timed(
        lambda: _gather_then_verify(
            args.method, target_logits, draft_ids, full_draft, uniforms, params, shard
        ),
        args.iters,
    )
    tp_size = shard.world_size
    return dict(
        tp=tp_size,
        B=batch_size,
        g=gamma,
        gather_s=gather_s,
        parallel_s=parallel_s,
        gather_bytes=gather_bytes,
        parallel_bytes=parallel_bytes,
        # Busiest rank: rank 0 receives every other shard's logits and all of q.
        gather_inbound=batch_size * gamma * shard.vocab_size * FLOAT_BYTES
        + (tp_size - 1) * batch_size * (gamma + 1) * shard.max_shard_size * FLOAT_BYTES,
        # Every rank: its q slice and its share of the collectives (they are symmetric).
        parallel_inbound=batch_size * gamma * shard.max_shard_size * FLOAT_BYTES + parallel_bytes // tp_size,
    )


def _worker(rank: int, tp_size: int, port: int, args, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=tp_size)
    params = SamplingParams()
    shard = VocabShard(args.vocab_size)
    for batch_size in args.batch_sizes:
        for gamma in args.gammas:
            row = _time_config(batch_size, gamma, shard, params, args)
            if rank == 0:
                results.put(row)
    dist.destroy_process_group()


def _table(rows: list[dict], vocab_size: int, method: str, iters: int) -> str:
    lines = [
        f"Vocabulary-parallel vs gather-then-verify, method={method}, V={vocab_size}, fp32 logits, gloo on CPU, "
        f"fastest of {iters} calls (ms); bytes per iteration",
        "",
        "| tp | B | g | gather+verify ms | vocab-parallel ms | time ratio | collective bytes gather | "
        "collective bytes parallel | busiest-rank inbound gather (incl. q) | busiest-rank inbound parallel (incl. q) | inbound ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tp']} | {r['B']} | {r['g']} | {r['gather_s'] * 1e3:.1f} | {r['parallel_s'] * 1e3:.1f} | "
            f"{r['gather_s'] / r['parallel_s']:.2f}x | {_human(r['gather_bytes'])} | {_human(r['parallel_bytes'])} | "
            f"{_human(r['gather_inbound'])} | {_human(r['parallel_inbound'])} | {r['gather_inbound'] / r['parallel_inbound']:.1f}x |"
        )
    return "\n".join(lines)


def _human(num_bytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if num_bytes < 1024 or unit == "GB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    return str(num_bytes)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=128256)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32, 128])
    parser.add_argument("--gammas", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--tp-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--method", choices=["block", "token"], default="block")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if any(tp < 2 for tp in args.tp_sizes):
        parser.error("--tp-sizes must be >= 2")
    context = mp.get_context("spawn")
    rows = []
    for tp_size in args.tp_sizes:
        results = context.Queue()
        port = _free_port()
        processes = [
            context.Process(target=_worker, args=(rank, tp_size, port, args, results))
            for rank in range(tp_size)
        ]
        for process in processes:
            process.start()
        expected = len(args.batch_sizes) * len(args.gammas)
        rows.extend(results.get(timeout=3600) for _ in range(expected))
        for process in processes:
            process.join()
            if process.exitcode != 0:
                raise RuntimeError(f"a tp={tp_size} worker exited with {process.exitcode}")
    table = _table(rows, args.vocab_size, args.method, args.iters)
    print(table)
    if args.out is not None:
        args.out.write_text(table + "\n")
    return table


if __name__ == "__main__":
    main()
