"""Picklable model factories: what the coordinator hands to each actor to build its model.

Each actor calls its factory in its own process, so a factory must be cheap to pickle (a
description, never weights) and deterministic. Two optional verbs let the runtime do better than
building the whole model in every shard:
- `fetch()`: download or convert the model's files; run once per node before any actor loads
  (group.fetch_on_nodes), outside parallel.load_timeout_s;
- `checkpoint()`: the local safetensors checkpoint a target shard reads only its slice from
  (shard_loading.load_shard); None when the model is built in code (TinyLlamaFactory) or derived
  from the target (truncated and distilled drafts): then the shard builds it whole and AutoTP cuts it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from distributed_spec.distributed.shard_loading import Checkpoint
from distributed_spec.models.loading import ModelSpec, checkpoint_dir, load_model, load_pair
from distributed_spec.models.tiny import perturbed_copy, tiny_llama


@dataclass(frozen=True)
class TinyLlamaFactory:
    """A tiny random Llama (models/tiny.py), optionally perturbed into a draft of another seed's target."""

    vocab_size: int = 64
    num_layers: int = 2
    hidden: int = 32
    seed: int = 0
    logit_scale: float = 1.0
    # When set, the model is `perturbed_copy(target, noise, noise_seed)`: a draft that agrees often.
    noise: float | None = None
    noise_seed: int = 1

    def __call__(self) -> torch.nn.Module:
        model = tiny_llama(
            vocab_size=self.vocab_size,
            num_layers=self.num_layers,
            hidden=self.hidden,
            seed=self.seed,
            logit_scale=self.logit_scale,
        )
        if self.noise is not None:
            model = perturbed_copy(model, noise=self.noise, seed=self.noise_seed)
        return model


@dataclass(frozen=True)
class SpecFactory:
    """A model described by models.loading.ModelSpec; a draft derived from the target (kind
    "truncated" or "distilled") also names the target it derives from."""

    spec: ModelSpec
    target_spec: ModelSpec | None = None

    def __call__(self) -> torch.nn.Module:
        if self.spec.resolved_kind in ("truncated", "distilled"):
            if self.target_spec is None:
                raise ValueError(
                    f"draft kind {self.spec.resolved_kind!r} needs target_spec (the target's model spec)"
                )
            return load_pair(self.target_spec, self.spec)[1].model
        return load_model(self.spec).model

    def fetch(self) -> None:
        """Download or convert the files this model loads from (the target's too, for a derived draft)."""
        for spec in (self.target_spec, self.spec):
            if spec is not None:
                checkpoint_dir(spec, download=True)

    def checkpoint(self) -> Checkpoint | None:
        """The fetched safetensors checkpoint (None for a draft derived from the target)."""
        directory = checkpoint_dir(self.spec)
        if directory is None:
            return None
        return Checkpoint(directory, self.spec.torch_dtype, self.spec.trust_remote_code)

    def on_device(self, device: str) -> SpecFactory:
        """The same model built on `device` (e.g. a draft moved to the CPU by parallel.draft_device=cpu).

        A derived draft loads its target too, so the target's spec moves with it.
        """
        target_spec = None if self.target_spec is None else replace(self.target_spec, device=device)
        return SpecFactory(replace(self.spec, device=device), target_spec)
