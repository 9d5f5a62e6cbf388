"""Draft probabilities on the wire: the draft samples from exactly what the verifier decodes."""

import pickle

import pytest
import torch

from distributed_spec.distributed.messages import StepRequest, StepResult
from distributed_spec.distributed.wire import (
    DraftBlock,
    WireFormat,
    block_wire_bytes,
    decode_probs,
    encode_probs,
    num_block_outputs,
    point_mass_pairs,
    sample_view,
    unpack_probs,
    unpack_probs_slice,
)
from distributed_spec.verify import RowSampling, SamplingParams, logits_to_probs
from distributed_spec.verify_parallel import vocab_shard_range


def _probs(batch_size: int, vocab_size: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(batch_size, vocab_size, generator=generator)).softmax(dim=-1)  # [B, V]


@pytest.mark.parametrize(
    "wire",
    [WireFormat("float32"), WireFormat("bfloat16"), WireFormat("float16"), WireFormat("float32", top_k=5),
     WireFormat("bfloat16", top_k=5)],
    ids=lambda wire: f"{wire.dtype}-top{wire.top_k}",
)
def test_sampled_probs_equal_decoded_probs_bitwise(wire: WireFormat) -> None:
    g, vocab_size = 3, 50
    steps = [sample_view(_probs(4, vocab_size, seed), wire) for seed in range(g)]
    sampled = torch.stack([step[0] for step in steps], dim=1)  # [B, g, V]
    values = torch.stack([step[1] for step in steps], dim=1)
    ids = None if steps[0][2] is None else torch.stack([step[2] for step in steps], dim=1)
    block = DraftBlock(draft_ids=torch.zeros(4, g, dtype=torch.long), probs_values=values, probs_ids=ids,
                       vocab_size=vocab_size)
    decoded = unpack_probs(block, torch.device("cpu"))
    assert torch.equal(decoded, sampled)
    assert torch.allclose(decoded.sum(-1), torch.ones(4, g), atol=1e-5)
    # The bench's byte count (computed, nothing run) is what the block carries.
    assert block.num_wire_bytes == block_wire_bytes(4, g, vocab_size, wire)


def test_top_k_keeps_only_k_ids_and_shrinks_the_message() -> None:
    probs = _probs(2, 100, seed=0)
    sampled, values, ids = sample_view(probs, WireFormat("bfloat16", top_k=4))
    assert values.shape == (2, 4) and ids.dtype == torch.int32
    assert ((sampled > 0).sum(-1) == 4).all()
    # The kept ids are the 4 most likely ones of the unrounded q.
    assert torch.equal(ids.long().sort(-1).values, probs.topk(4).indices.sort(-1).values)


def test_reduced_precision_changes_q_so_the_round_trip_matters() -> None:
    probs = _probs(2, 100, seed=1)
    sampled, _, _ = sample_view(probs, WireFormat("bfloat16"))
    assert not torch.equal(sampled, probs)
    assert torch.allclose(sampled, probs, rtol=1e-2, atol=1e-6)
    assert torch.equal(decode_probs(probs.to(torch.bfloat16), None, 100), sampled)


def test_greedy_sends_no_probabilities() -> None:
    block = DraftBlock(draft_ids=torch.zeros(1, 2, dtype=torch.long), probs_values=None, probs_ids=None, vocab_size=9)
    assert unpack_probs(block, torch.device("cpu")) is None
    assert block.num_wire_bytes == 16 == block_wire_bytes(1, 2, 9, WireFormat(send_probs=False))


@pytest.mark.parametrize(("dtype", "top_k"), [("float32", 0), ("bfloat16", 0), ("float16", 0), ("bfloat16", 5)])
def test_a_shards_vocabulary_slice_of_q_is_the_whole_decode_sliced_bitwise(dtype, top_k):
    """parallel.verify=vocab_parallel: each shard decodes only its ids, to the very numbers the whole
    decode gives them (a dense q is cut by the draft, a top-k one is sent whole)."""
    probs = torch.softmax(torch.randn(3, 2, 65, generator=torch.Generator().manual_seed(0)), dim=-1)
    wire = WireFormat(dtype, top_k=top_k, vocab_shards=2)
    values, ids = encode_probs(probs, wire)
    block = DraftBlock(draft_ids=torch.zeros(3, 2, dtype=torch.long), probs_values=values, probs_ids=ids, vocab_size=65)
    whole = unpack_probs(block, torch.device("cpu"))
    slices = block.vocab_slices(2)
    assert len(slices) == num_block_outputs(wire) == 2
    for rank, piece in enumerate(slices):
        start, end = vocab_shard_range(65, 2, rank)
        assert torch.equal(unpack_probs_slice(piece, start, end, torch.device("cpu")), whole[..., start:end])
        assert piece.group_wire_bytes == sum(s.num_wire_bytes for s in slices)
    if top_k == 0:
        assert slices[1].probs_values.shape[-1] == 32  # only its ids travel


@pytest.mark.parametrize(
    "wire",
    [WireFormat("float32"), WireFormat("bfloat16"), WireFormat("float32", top_k=5), WireFormat("bfloat16", vocab_shards=2)],
    ids=lambda wire: f"{wire.dtype}-top{wire.top_k}-shards{wire.vocab_shards}",
)
def test_a_temperature_0_block_as_point_masses_decodes_to_the_dense_one_hot_bitwise(wire):
    """The draft sends a greedy step's q as (1, X_i) pairs: every decode reads what the dense
    encoding of the same one-hot q gives (logits_to_probs at temperature 0), whole and by slice."""
    vocab_size = 65
    logits = torch.randn(3, 2, vocab_size, generator=torch.Generator().manual_seed(2))
    one_hot = logits_to_probs(logits, SamplingParams(temperature=0.0))  # [B, g, V]
    draft_ids = one_hot.argmax(dim=-1)  # what the draft samples from it
    dense = DraftBlock(draft_ids, *encode_probs(one_hot, wire), vocab_size=vocab_size)
    pairs = DraftBlock(draft_ids, *point_mass_pairs(draft_ids), vocab_size=vocab_size)
    cpu = torch.device("cpu")
    assert torch.equal(unpack_probs(pairs, cpu), unpack_probs(dense, cpu))
    assert torch.equal(unpack_probs(pairs, cpu), one_hot)
    for rank, (piece, dense_piece) in enumerate(zip(pairs.vocab_slices(2), dense.vocab_slices(2))):
        start, end = vocab_shard_range(vocab_size, 2, rank)
        assert torch.equal(unpack_probs_slice(piece, start, end, cpu), unpack_probs_slice(dense_piece, start, end, cpu))
    assert pairs.num_wire_bytes == 3 * 2 * (8 + 4 + 4)


def test_messages_pickle_their_tensors_as_numpy_and_come_back_the_same():
    """PickledAsNumpy: every tensor field comes back with its dtype, shape and values, writable; a
    view sends its own elements only; bfloat16 and None travel as they are."""
    storage = torch.arange(1000, dtype=torch.float64)
    request = StepRequest(
        keep_rows=torch.tensor([0, 2]),
        new_prompts=[[1, 2, 3]],
        decoding=torch.tensor([True, False, True]),
        num_draft_tokens=torch.tensor([2, 0, 2], dtype=torch.long),
        eta=storage[:6].view(3, 2),
        u=torch.rand(3, dtype=torch.float64),
        sampling=RowSampling.uniform(SamplingParams(temperature=0.5), 3),
    )
    block = DraftBlock(
        torch.zeros(3, 2, dtype=torch.long), torch.rand(3, 2, 7).to(torch.bfloat16), torch.zeros(3, 2, 7, dtype=torch.int32), 7
    )
    for message in (request, block, StepResult(*(torch.arange(3),) * 3, torch.tensor([1, 1, 1]))):
        restored = pickle.loads(pickle.dumps(message))
        for name, value in vars(message).items():
            back = getattr(restored, name)
            if isinstance(value, torch.Tensor):
                assert isinstance(back, torch.Tensor) and back.dtype == value.dtype and torch.equal(back, value), name
                back[...] = back.clone()  # writable
            else:
                assert back == value, name
    assert len(pickle.dumps(request)) < storage.numel() * storage.element_size() // 4
    # Ray hands large arrays over read-only (zero-copy): they come back as writable copies.
    frozen = pickle.loads(pickle.dumps(block)).__getstate__()
    frozen["draft_ids"].flags.writeable = False
    restored = DraftBlock.__new__(DraftBlock)
    restored.__setstate__(frozen)
    restored.draft_ids[0, 0] = 5
    assert frozen["draft_ids"][0, 0] == 0
