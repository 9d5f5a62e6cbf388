"""Per-shard checkpoint loading (distributed/shard_loading.py) against AutoTP over the full model.

    timeout 600 .venv/bin/python -m pytest tests/distributed/test_shard_loading.py -q

Two ranks in spawned processes (gloo, DeepSpeed on the CPU) load a tiny Llama saved as safetensors:
- the shard equals what AutoTP cuts from the fully built model, weight for weight and logit for logit,
  for a tied output head (SmolLM2's layout; it stays one parameter) and an untied one, and at TP = 1;
- no rank allocates the full weights: its parameters are about half of them and its peak resident
  memory while loading grows by less than the full weights (building the full model first grows it
  by more than that).
"""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp

from distributed_spec.models.tiny import tiny_llama_config

pytestmark = [pytest.mark.timeout(600)]

TP_SIZE = 2


def _save_tiny(directory, tied: bool, hidden: int, vocab_size: int, num_layers: int) -> int:
    """Save a random tiny Llama as safetensors; returns its weight bytes (a tied weight once)."""
    from transformers import LlamaForCausalLM

    config = tiny_llama_config(vocab_size=vocab_size, num_layers=num_layers, hidden=hidden, num_heads=8, num_kv_heads=4)
    config.tie_word_embeddings = tied
    config.intermediate_size = 4 * hidden  # a multiple of AutoTP's grain (64): both ranks get MLP columns
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(directory)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _join_group(rank: int, port: int, tp_size: int) -> None:
    from distributed_spec.distributed.rendezvous import Rendezvous, ShardPlacement, init_shard_group

    rendezvous = Rendezvous(master_addr="127.0.0.1", master_port=port, world_size=tp_size)
    init_shard_group(rendezvous, ShardPlacement(rank=rank, local_rank=rank, local_size=tp_size), "cpu", "gloo", 120)


def _compare_worker(rank: int, port: int, tp_size: int, directory: str, results) -> None:
    from transformers import AutoModelForCausalLM

    from distributed_spec.distributed.shard_loading import Checkpoint, autotp, load_shard

    _join_group(rank, port, tp_size)
    input_ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(3))
    full = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    reference = autotp(full, tp_size, torch.float32)
    shard = load_shard(Checkpoint(directory, torch.float32), tp_size)
    with torch.no_grad():
        same_logits = torch.equal(
            reference(input_ids=input_ids).logits, shard(input_ids=input_ids).logits
        )
    reference_params = dict(reference.named_parameters(remove_duplicate=False))
    mismatched = [
        name
        for name, param in shard.named_parameters(remove_duplicate=False)
        if "embed_tokens" not in name and not torch.equal(param, reference_params[name])
    ]
    buffers_equal = all(
        torch.equal(buffer, dict(reference.named_buffers())[name]) for name, buffer in shard.named_buffers()
    )
    # A tied head stays one parameter (TP = 1: the embedding itself; TP > 1: the hidden-sharded one).
    tied = shard.get_output_embeddings().weight is shard.get_input_embeddings().weight
    results.put((rank, same_logits, mismatched, buffers_equal, tied))


def _memory_worker(rank: int, port: int, tp_size: int, directory: str, full_path: bool, results) -> None:
    from transformers import AutoModelForCausalLM

    from distributed_spec.distributed.memory import peak_rss_bytes, reset_peak_rss, rss_bytes
    from distributed_spec.distributed.shard_loading import Checkpoint, autotp, load_shard, parameter_bytes

    _join_group(rank, port, tp_size)
    reset_peak_rss()
    before = rss_bytes()
    if full_path:
        model = autotp(AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32), tp_size, torch.float32)
    else:
        model = load_shard(Checkpoint(directory, torch.float32), tp_size)
    peak_growth = peak_rss_bytes() - before
    results.put((rank, parameter_bytes(model), peak_growth))


def _run_ranks(worker, tp_size: int, *args) -> list[tuple]:
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    mp.start_processes(worker, args=(_free_port(), tp_size, *args, results), nprocs=tp_size, start_method="spawn")
    return sorted(results.get() for _ in range(tp_size))


@pytest.mark.parametrize(("tied", "tp_size"), [(True, 2), (False, 2), (True, 1)])
def test_shard_equals_autotp_over_the_full_model(tmp_path, tied, tp_size):
    _save_tiny(tmp_path, tied, hidden=64, vocab_size=64, num_layers=2)
    for rank, same_logits, mismatched, buffers_equal, head_tied in _run_ranks(_compare_worker, tp_size, str(tmp_path)):
        assert same_logits, f"rank {rank}: logits differ"
        assert mismatched == [], f"rank {rank}: weights differ"
        assert buffers_equal, f"rank {rank}: buffers differ"
        assert head_tied == tied


def test_no_shard_allocates_the_full_weights(tmp_path):
    # SmolLM2's layout (tied head, a large vocabulary), scaled to 16M parameters (64 MB).
    full_bytes = _save_tiny(tmp_path, tied=True, hidden=512, vocab_size=8192, num_layers=4)
    sharded = _run_ranks(_memory_worker, TP_SIZE, str(tmp_path), False)
    for rank, param_bytes, peak_growth in sharded:
        assert param_bytes <= 0.6 * full_bytes, f"rank {rank} holds {param_bytes / full_bytes:.2f} of the weights"
        assert peak_growth < 0.85 * full_bytes, f"rank {rank} grew by {peak_growth / full_bytes:.2f} x the weights"
    # The old path (build the whole model, then cut it) does allocate them: the check can tell.
    full = _run_ranks(_memory_worker, TP_SIZE, str(tmp_path), True)
    assert all(peak_growth >= full_bytes for _, _, peak_growth in full)
