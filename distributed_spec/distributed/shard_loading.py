"""One tensor-parallel shard of the target, built from a safetensors checkpoint by reading only its slice.

    model = load_shard(Checkpoint(directory, torch.float32), tp_size=2)   # inside an initialised group

Every shard used to build the whole model and let DeepSpeed AutoTP cut it down, so each rank held the
full weights for a moment and host RAM held tp_size copies at once. Here no rank ever does:
1. the model is built from its config.json with its parameters on the meta device (accelerate's
   `init_empty_weights`; buffers such as the rotary frequencies stay real): nothing is allocated;
2. DeepSpeed AutoTP shards the meta model (`init_inference`, the same call as for a built model):
   its layers allocate empty tensors of their shard's shape on the device, and `to_empty` the rest
   (embeddings, norms);
3. a tied output head (SmolLM2's lm_head is embed_tokens) stays tied: the embedding becomes
   DeepSpeed's `HiddenParallelEmbedding` over the head's hidden-dimension shard (AutoTP alone would
   keep a full embedding and a second, cut copy in the head);
4. each parameter is filled from the memory-mapped checkpoint: one that AutoTP did not cut is read
   whole; a cut one differs from the checkpoint's tensor along one dimension, which AutoTP cut into
   contiguous pieces in rank order (the shard sizes of every rank come from one all_gather), and
   safetensors' `get_slice` reads just this rank's piece.
Host memory then holds the shard and at most READ_BLOCK_BYTES of mapped checkpoint pages at a time.

Step 4 relies on AutoTP's contiguous splits (LinearLayer, LinearAllreduce, LmHeadLinearAllreduce:
Llama, Mistral, Qwen2 and the like). Fused projections that AutoTP cuts in strided pieces are refused
(`UNSLICEABLE_LAYERS`); tests/distributed/test_shard_loading.py checks the result against AutoTP over
the fully built model, weight for weight.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open

logger = logging.getLogger(__name__)

# Checkpoint bytes mapped at once while reading a piece (bounds the transient resident memory).
READ_BLOCK_BYTES = 32 * 2**20
# AutoTP layers that cut a weight in strided (not contiguous, rank-ordered) pieces.
UNSLICEABLE_LAYERS = ("fused_LinearLayer", "GateUpPack_LinearLayer", "conv_LinearLayer", "Yuan_LinearLayer")


@dataclass(frozen=True)
class Checkpoint:
    """A local Hugging Face model directory (config.json + *.safetensors) and how to build it."""

    directory: Path
    # dtype of the built model; checkpoint tensors are cast to it slice by slice.
    dtype: torch.dtype
    trust_remote_code: bool = False


def tensor_files(directory: Path) -> dict[str, Path]:
    """Checkpoint tensor name -> the safetensors file holding it (sharded index or one file)."""
    directory = Path(directory)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: directory / file for name, file in weight_map.items()}
    single = directory / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"{directory} holds no model.safetensors or model.safetensors.index.json")
    with safe_open(single, framework="pt") as handle:
        return dict.fromkeys(handle.keys(), single)


def empty_model(checkpoint: Checkpoint) -> torch.nn.Module:
    """The model of `checkpoint` with parameters on the meta device and real buffers (no weights read)."""
    from accelerate import init_empty_weights  # noqa: PLC0415 - heavy; only shards need it
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415

    config = AutoConfig.from_pretrained(checkpoint.directory, trust_remote_code=checkpoint.trust_remote_code)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(
            config, dtype=checkpoint.dtype, trust_remote_code=checkpoint.trust_remote_code
        )
    return model.eval()


def autotp(model: torch.nn.Module, tp_size: int, dtype: torch.dtype) -> torch.nn.Module:
    """DeepSpeed AutoTP over a built or meta model; returns the sharded module (in place)."""
    import deepspeed  # noqa: PLC0415 - imported only after the distributed environment is set

    if getattr(model, "is_quantized", False) and all(p.dtype == dtype for p in model.parameters()):
        # GGUF checkpoints load dequantised but flagged as quantised; DeepSpeed's dtype pass (a no-op
        # here) calls .float(), which transformers refuses on a flagged model.
        model.is_quantized = False
    engine = deepspeed.init_inference(
        model, tensor_parallel={"tp_size": tp_size}, dtype=dtype, replace_with_kernel_inject=False
    )
    return engine.module


def restore_buffers(model: torch.nn.Module, buffers: dict[str, torch.Tensor], device: torch.device) -> None:
    """Put back buffers that `to_empty` overwrote with uninitialised memory (AutoTP never cuts them)."""
    for name, value in buffers.items():
        module_name, _, leaf = name.rpartition(".")
        module = model.get_submodule(module_name)
        if leaf in module._buffers:
            module._buffers[leaf] = value.to(device)


def tie_embedding_to_head(model: torch.nn.Module) -> None:
    """Make a tied input embedding share the output head's hidden-dimension shard (no full copy).

    Exact: each rank looks up its columns of the embedding and an all-gather concatenates them.
    """
    from deepspeed.module_inject.layers import HiddenParallelEmbedding, LmHeadLinearAllreduce  # noqa: PLC0415

    head = model.get_output_embeddings()
    if not getattr(model.config, "tie_word_embeddings", False):
        return
    if not isinstance(head, LmHeadLinearAllreduce):
        # An uncut head (TP = 1): `to_empty` gave it a parameter of its own; share the embedding's again.
        model.tie_weights()
        return
    embedding = model.get_input_embeddings()
    model.set_input_embeddings(
        HiddenParallelEmbedding(
            embedding, head.mp_group, tied_row_parallel_linear=head, name="embed_tokens", tp_meta=head.tp_meta
        )
    )


def checkpoint_key(model: torch.nn.Module, name: str, files: dict[str, Path]) -> str:
    """The checkpoint tensor behind parameter `name` (a tied head reads the input embedding's)."""
    if name in files:
        return name
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and name == _param_name(model, head.weight):
        tied = _param_name(model, embedding.weight)
        if tied in files:
            return tied
    raise KeyError(f"parameter {name} is not in the checkpoint ({len(files)} tensors)")


def _param_name(model: torch.nn.Module, param: torch.Tensor) -> str | None:
    return next((name for name, p in model.named_parameters(remove_duplicate=False) if p is param), None)


def checkpoint_shape(path: Path, key: str) -> tuple[int, ...]:
    """Shape of one checkpoint tensor, from the file's header (no data read)."""
    with safe_open(path, framework="pt") as handle:
        return tuple(handle.get_slice(key).get_shape())


def shard_cuts(
    shapes: dict[str, tuple[int, ...]], full_shapes: dict[str, tuple[int, ...]], rank: int
) -> dict[str, tuple[int, int] | None]:
    """Where this rank's piece lies along the dimension AutoTP cut, from every rank's shapes.

    Args:
        shapes: parameter name -> this rank's shape; every rank calls this collectively.
        full_shapes: parameter name -> the checkpoint tensor's shape.
    Returns:
        name -> (cut dimension, offset), or None for a parameter held whole.
    """
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    all_shapes: list[dict[str, tuple[int, ...]]] = [shapes]
    if world_size > 1:
        all_shapes = [None] * world_size  # type: ignore[list-item]
        dist.all_gather_object(all_shapes, shapes)
    cuts: dict[str, tuple[int, int] | None] = {}
    for name, shape in shapes.items():
        full = full_shapes[name]
        cut = [dim for dim, size in enumerate(full) if len(shape) == len(full) and shape[dim] != size]
        if len(shape) != len(full) or len(cut) > 1:
            raise ValueError(f"{name}: shard shape {shape} is no one-dimensional cut of {full}")
        if not cut:
            cuts[name] = None
            continue
        dim = cut[0]
        sizes = [other[name][dim] for other in all_shapes]
        if sum(sizes) != full[dim]:
            raise ValueError(f"{name}: the ranks' pieces {sizes} do not tile dimension {dim} of {full}")
        cuts[name] = (dim, sum(sizes[:rank]))
    return cuts


def row_blocks(shape: tuple[int, ...], itemsize: int, max_bytes: int) -> list[tuple[int, int]]:
    """[start, stop) ranges over dim 0 of a tensor of `shape` whose rows span at most max_bytes each."""
    row_bytes = max(1, itemsize * math.prod(shape[1:]))
    step = max(1, max_bytes // row_bytes)
    return [(start, min(start + step, shape[0])) for start in range(0, shape[0], step)]


def copy_piece(
    param: torch.Tensor, path: Path, key: str, cut: tuple[int, int] | None, max_bytes: int = READ_BLOCK_BYTES
) -> None:
    """Copy this rank's piece of checkpoint tensor `key` into `param`, a block of rows at a time.

    Args:
        param: this rank's parameter, [d_0, ...] (the checkpoint tensor cut along `cut`'s dimension).
        cut: (dimension, offset) of the piece, or None when `param` is the whole tensor.
    The file is mapped once per block: pages a read touches stay resident while their mapping is
    open, so reading a column piece through one mapping would make the whole tensor resident.
    """
    full_shape = checkpoint_shape(path, key)
    if not full_shape:
        with safe_open(path, framework="pt") as handle, torch.no_grad():
            param.copy_(handle.get_tensor(key))
        return
    for start, stop in row_blocks(full_shape, param.element_size(), max_bytes):
        index = [slice(start, stop)] + [slice(None)] * (len(full_shape) - 1)
        rows = slice(start, stop)  # the rows of `param` this block fills
        if cut is not None and cut[0] == 0:
            # A row piece: only the blocks that overlap [offset, offset + d_0) are read.
            offset = cut[1]
            lo, hi = max(start, offset), min(stop, offset + param.shape[0])
            if lo >= hi:
                continue
            index[0], rows = slice(lo, hi), slice(lo - offset, hi - offset)
        elif cut is not None:
            dim, offset = cut
            index[dim] = slice(offset, offset + param.shape[dim])
        with safe_open(path, framework="pt") as handle:
            block = handle.get_slice(key)[tuple(index)]
        with torch.no_grad():
            param[rows].copy_(block.to(param.dtype))


def fill_from_checkpoint(model: torch.nn.Module, files: dict[str, Path]) -> None:
    """Copy each parameter's piece of the checkpoint into it (collective: every rank calls it)."""
    params = dict(model.named_parameters())
    keys = {name: checkpoint_key(model, name, files) for name in params}
    full_shapes = {name: checkpoint_shape(files[key], key) for name, key in keys.items()}
    rank = dist.get_rank() if dist.is_initialized() else 0
    cuts = shard_cuts({name: tuple(p.shape) for name, p in params.items()}, full_shapes, rank)
    for name, param in params.items():
        copy_piece(param, files[keys[name]], keys[name], cuts[name])


def check_sliceable(model: torch.nn.Module) -> None:
    """Refuse AutoTP layers whose pieces are not contiguous (step 4 of the module docstring)."""
    found = sorted({type(m).__name__ for m in model.modules() if type(m).__name__ in UNSLICEABLE_LAYERS})
    if found:
        raise NotImplementedError(
            f"AutoTP cut this model with {found}, whose pieces are strided: per-shard checkpoint reads "
            "support separate q/k/v and gate/up projections (Llama-like models) only"
        )


def load_shard(checkpoint: Checkpoint, tp_size: int, device: torch.device | None = None) -> torch.nn.Module:
    """This rank's shard of the checkpoint's model, ready for inference (collective).

    Call inside an initialised shard group (rendezvous.init_shard_group) on every rank.
    """
    device = device or torch.device("cpu")
    files = tensor_files(checkpoint.directory)
    model = empty_model(checkpoint)
    buffers = {name: buffer.clone() for name, buffer in model.named_buffers()}
    model = autotp(model, tp_size, checkpoint.dtype)
    check_sliceable(model)
    restore_buffers(model, buffers, device)
    tie_embedding_to_head(model)
    fill_from_checkpoint(model, files)
    logger.info(
        "shard loaded from %s: %.1f MB of parameters",
        checkpoint.directory,
        parameter_bytes(model) / 2**20,
    )
    return model.eval()


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's distinct parameters (a tied weight counts once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())
