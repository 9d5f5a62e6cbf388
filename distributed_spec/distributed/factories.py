"""Picklable model factories: what the coordinator hands to each actor to build its model.

Each actor calls its factory in its own process, so a factory must be cheap to pickle (a
description, never weights) and deterministic: every target shard builds the same full model and
keeps its own slice of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distributed_spec.models.loading import ModelSpec, load_model, load_pair
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
