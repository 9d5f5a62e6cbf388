"""Test shorthand: an EngineConfig with some fields changed, named as in their groups.

    engine_replace(config, method="token", temperature=1.0, prefill_chunk_tokens=None)

Each name is a field of exactly one of VerifierConfig, SamplingConfig, SchedulingConfig or
EngineConfig itself (engine/config.py), so the keyword says where it goes; `sampling=` also takes
a SamplingParams (its temperature, top_k and top_p).
"""

from __future__ import annotations

import dataclasses

from distributed_spec.engine.config import EngineConfig, SamplingConfig, SchedulingConfig, VerifierConfig
from distributed_spec.verify import SamplingParams

_GROUPS = {"verifier": VerifierConfig, "sampling": SamplingConfig, "scheduling": SchedulingConfig}


def engine_replace(config: EngineConfig, **changes) -> EngineConfig:
    params = changes.pop("sampling", None)
    if isinstance(params, SamplingParams):
        changes.update(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p)
    elif params is not None:
        changes["sampling"] = params
    grouped: dict[str, dict] = {group: {} for group in _GROUPS}
    top = {}
    for name, value in changes.items():
        owners = [group for group, cls in _GROUPS.items() if name in {f.name for f in dataclasses.fields(cls)}]
        if owners:
            grouped[owners[0]][name] = value
        else:
            top[name] = value
    for group, values in grouped.items():
        if values:
            top[group] = dataclasses.replace(getattr(config, group), **values)
    return dataclasses.replace(config, **top)
