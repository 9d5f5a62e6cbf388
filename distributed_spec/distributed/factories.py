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
from distributed_spec.models.config import ModelConfig, ModelSpec
from distributed_spec.models.loading import checkpoint_dir, load_model, load_pair, torch_dtype
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
    """A model described by a models.config.ModelSpec, built on `device` with the pair's model.dtype
    and model.trust_remote_code; a draft derived from the target (kind "truncated" or "distilled")
    also names the target it derives from."""

    spec: ModelSpec
    target_spec: ModelSpec | None = None
    device: str = "cpu"
    dtype: str = "auto"
    trust_remote_code: bool = False
    # model.cpu_prepack: the actor packs the built model's bf16 CPU linears (models/cpu_linear.py).
    # Not here in __call__: a target shard packs after AutoTP has cut its layers.
    cpu_prepack: bool = False

    @classmethod
    def for_pair(cls, model: ModelConfig, device: str) -> tuple[SpecFactory, SpecFactory]:
        """The target's factory and the draft's (which names the target) for the Hydra group `model`."""
        options = {
            "device": device,
            "dtype": model.dtype,
            "trust_remote_code": model.trust_remote_code,
            "cpu_prepack": model.cpu_prepack,
        }
        return cls(model.target, **options), cls(model.draft, target_spec=model.target, **options)

    def __call__(self) -> torch.nn.Module:
        options = {"device": self.device, "dtype": self.dtype, "trust_remote_code": self.trust_remote_code}
        if self.spec.resolved_kind in ("truncated", "distilled"):
            if self.target_spec is None:
                raise ValueError(
                    f"draft kind {self.spec.resolved_kind!r} needs target_spec (the target's model spec)"
                )
            # The pair's loader: it checks the draft against the target it derives from.
            return load_pair(self._pair(), self.device)[1].model
        return load_model(self.spec, **options).model

    def _pair(self) -> ModelConfig:
        return ModelConfig(
            name="pair",
            target=self.target_spec,
            draft=self.spec,
            dtype=self.dtype,
            trust_remote_code=self.trust_remote_code,
        )

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
        return Checkpoint(directory, torch_dtype(self.dtype, self.device), self.trust_remote_code)

    def on_device(self, device: str) -> SpecFactory:
        """The same model built on `device` (e.g. a draft moved to the CPU by parallel.draft_device=cpu);
        a derived draft loads its target there too."""
        return replace(self, device=device)
