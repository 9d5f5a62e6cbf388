"""Grow an exported distilled draft by identity layers: a deeper draft that starts out computing exactly
what the original computes, to warm-start `python -m distributed_spec.distill --init-from` with more capacity.

    python -m research.grow_draft --from distributed_spec/assets/drafts/smollm2-draft --out /tmp/init4 \
        --insert-at 1 --new-layers 1,28

Each new layer is a target decoder layer (MLP pruned to the draft's width, as `--init-layers` does)
with o_proj and down_proj zeroed: both residual branches add 0, so the layer is the identity until
training moves it, while its other weights start from useful target features.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from distributed_spec.distill.teacher import load_target
from distributed_spec.distill.train import init_from_target
from distributed_spec.models.distilled import (
    CONFIG_NAME,
    SUB_VOCAB_KEY,
    WEIGHTS_NAME,
    build_draft,
    draft_llama_config,
    read_draft_weights,
)

LAYER_PREFIX = "model.layers."
ZEROED = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def layers_of(weights: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """{"model.layers.i.<rest>": t} -> [{"<rest>": t} for each layer i], in layer order."""
    by_index: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in weights.items():
        if name.startswith(LAYER_PREFIX):
            index, rest = name[len(LAYER_PREFIX):].split(".", 1)
            by_index.setdefault(int(index), {})[rest] = tensor
    return [by_index[i] for i in sorted(by_index)]


def grow_draft(source_dir: Path, out_dir: Path, target_model, insert_at: int, new_layers: str) -> int:
    """Write a draft folder with identity layers (from target layers `new_layers`) inserted before layer
    `insert_at` of the draft in source_dir; returns the new number of layers."""
    meta = json.loads((source_dir / CONFIG_NAME).read_text())
    weights, sub_vocab_ids = read_draft_weights(source_dir)
    layers = layers_of(weights)
    if not 0 <= insert_at <= len(layers):
        raise ValueError(f"--insert-at must be in [0, {len(layers)}], got {insert_at}")
    width = meta["llama_config"]["intermediate_size"]
    names = [name.strip() for name in new_layers.split(",")]
    donor = build_draft(target_model, draft_llama_config(target_model.config, len(names), width))
    init_from_target(donor, target_model, new_layers)
    identity = layers_of({name: t.float() for name, t in donor.state_dict().items()})
    for layer in identity:
        for name in ZEROED:
            layer[name] = torch.zeros_like(layer[name])
    grown = layers[:insert_at] + identity + layers[insert_at:]
    tensors = {f"{LAYER_PREFIX}{i}.{rest}": t for i, layer in enumerate(grown) for rest, t in layer.items()}
    tensors.update({name: t for name, t in weights.items() if not name.startswith(LAYER_PREFIX)})
    tensors = {name: t.to(torch.bfloat16).contiguous() for name, t in tensors.items()}
    if sub_vocab_ids is not None:
        tensors[SUB_VOCAB_KEY] = sub_vocab_ids
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / WEIGHTS_NAME))
    meta["llama_config"]["num_hidden_layers"] = len(grown)
    meta["weight_format"] = "bf16"
    (out_dir / CONFIG_NAME).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return len(grown)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", required=True, help="exported draft folder")
    parser.add_argument("--out", required=True, help="folder for the grown draft")
    parser.add_argument("--target", default="smollm2", help='the target, as in python -m distributed_spec.distill')
    parser.add_argument("--insert-at", type=int, required=True, help="index of the draft layer the new ones go before")
    parser.add_argument("--new-layers", required=True, help='target layers that become identity layers, e.g. "1,28"')
    args = parser.parse_args(argv)
    target_model, _ = load_target(args.target)
    num_layers = grow_draft(Path(args.source), Path(args.out), target_model, args.insert_at, args.new_layers)
    print(f"wrote {args.out}: {num_layers} layers")
    return num_layers


if __name__ == "__main__":
    main()
