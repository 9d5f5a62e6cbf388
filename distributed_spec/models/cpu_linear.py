"""bfloat16 linears on the CPU with their weights packed once for oneDNN (model.cpu_prepack).

    from distributed_spec.models.cpu_linear import pack_cpu_linears
    num_packed = pack_cpu_linears(model)   # every bf16 nn.Linear on the CPU -> PackedLinear, in place

Why: torch's bf16 `F.linear` on the CPU hands oneDNN the plain [out, in] weight, and oneDNN reorders
it into its blocked layout on every call. At a few rows per call that reorder costs more than the
product: SmolLM2's 49152 x 576 head takes 4.1 ms a call plain and 2.4 ms packed at one row on this
project's 2-core host (`python -m scripts.bench_cpu_linear`, which also times whole forwards;
docs/RESULTS.md, "bfloat16 linears packed once"). Packing at load time is what torch.compile's CPU
freezing pass does to the weights; here it needs no compiler.

Exact: up to PACKED_MAX_ROWS rows per call the packed product is the kernel F.linear runs, minus
the per-call reorder, so the result is bitwise the same; bigger calls (prompts, wide batches, where
the reorder is amortised) go to F.linear itself. Each shape is checked at load against F.linear
(another CPU may pick another kernel) and left plain where they differ. So a packed model's logits
are the plain model's, bitwise (tests/models/test_cpu_linear.py: per shape and row count, whole
models, whole jobs). Costs: the packed copy sits beside the plain weight (which tied embeddings, the vocabulary-parallel
head and checkpoints keep reading), so the linears' memory doubles. float32 is left alone (its plain
path already streams the weights at memory speed), and so are DeepSpeed AutoTP's sharded layers
(tp_size > 1), which are not nn.Linear.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

# Rows per call up to which oneDNN's product over the packed weight is F.linear's, bitwise (torch
# 2.13 on x86; tests/models/test_cpu_linear.py sweeps 1-64 rows). Past it F.linear switches kernels,
# so a PackedLinear hands bigger calls (prompts, wide batches) to F.linear itself.
PACKED_MAX_ROWS = 32


def packing_available() -> bool:
    """Whether this torch build has oneDNN and its packed-linear ops (private ops: checked, not assumed)."""
    mkldnn_ops = getattr(torch.ops, "mkldnn", None)
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(mkldnn_ops, "_reorder_linear_weight")
        and hasattr(mkldnn_ops, "_linear_pointwise")
    )


def packable(linear: nn.Module) -> bool:
    """A plain bf16 nn.Linear on the CPU, not already packed."""
    return (
        type(linear) is nn.Linear
        and linear.weight.dtype == torch.bfloat16
        and linear.weight.device.type == "cpu"
    )


class PackedLinear(nn.Linear):
    """An nn.Linear whose product runs on a copy of its weight packed once for oneDNN.

    `weight` and `bias` stay the original parameters (shared, not copied), so everything that reads
    them (tied embeddings, head slicing, state_dict) sees the same tensors; only forward changes.
    Inference only: the packed op has no backward.
    """

    def __init__(self, linear: nn.Linear) -> None:
        nn.Module.__init__(self)  # not nn.Linear.__init__: the parameters are the original ones
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        # [out, in] in oneDNN's blocked layout; the hint 1 is the batch it is tuned for (B = 1 decoding).
        packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 1)
        self.register_buffer("packed_weight", packed, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]."""
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] > PACKED_MAX_ROWS:
            # F.linear takes another kernel past this many rows; where the reorder is amortised anyway.
            return F.linear(x, self.weight, self.bias)
        if not flat.is_contiguous():
            flat = flat.contiguous()
        bias = None if self.bias is None else self.bias.detach()
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed_weight, bias, "none", [], "")
        return out.view(*x.shape[:-1], self.out_features)


def matches_f_linear(packed: PackedLinear) -> bool:
    """Whether `packed` gives F.linear's result bitwise on this machine, at 1 and PACKED_MAX_ROWS rows
    (the kernel choice is oneDNN's, per CPU: checked at load, not assumed)."""
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for rows in (1, PACKED_MAX_ROWS):
            x = torch.randn(rows, packed.in_features, generator=generator).to(packed.weight.dtype)
            if not torch.equal(packed(x), F.linear(x, packed.weight, packed.bias)):
                return False
    return True


def pack_cpu_linears(model: nn.Module) -> int:
    """Replace every packable nn.Linear of `model` by a PackedLinear, in place; returns how many.

    A model with no bf16 CPU linears (float32, CUDA, AutoTP-sharded layers) is left as it is (0), and
    so is every linear of a shape whose packed product is not F.linear's on this machine (a warning).
    """
    if not packing_available():
        logger.warning("model.cpu_prepack: this torch build has no oneDNN packed linear; linears left plain")
        return 0
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if packable(child)
    ]
    packed: dict[int, PackedLinear] = {}
    exact_by_shape: dict[tuple[int, int, bool], bool] = {}
    for parent, name, child in targets:
        if id(child) not in packed:  # a module reachable twice (shared) is packed once, stays shared
            shape = (child.out_features, child.in_features, child.bias is not None)
            if exact_by_shape.get(shape) is False:
                continue  # known to differ here: not packed again just to be dropped
            replacement = PackedLinear(child)
            if shape not in exact_by_shape:
                exact_by_shape[shape] = matches_f_linear(replacement)
                if not exact_by_shape[shape]:
                    logger.warning("model.cpu_prepack: %s linears left plain (packed != F.linear here)", shape)
                    continue
            packed[id(child)] = replacement
        setattr(parent, name, packed[id(child)])
    return len(packed)
