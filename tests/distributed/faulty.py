"""A tiny target whose forward fails on cue: in every rank alike and before any collective, as a
bad number or an out-of-memory in the model would (hooks for the Ray runtime's fault tests)."""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from distributed_spec.distributed.factories import TinyLlamaFactory


@dataclass(frozen=True)
class FaultyTarget:
    """Builds `base`'s model with a forward pre-hook that injects `fault`:

    - "value_error": ValueError when a row's input holds the ids `poison` in a row;
    - "oom": torch.OutOfMemoryError (CUDA's message) for forwards over more than `max_rows` rows;
    - "hang": the `at_call`-th forward sleeps for an hour, once per rank and marker_dir (a marker file
      remembers it, so the relaunched group runs on).
    """

    base: TinyLlamaFactory
    fault: str
    poison: tuple[int, ...] = ()
    max_rows: int = 0
    at_call: int = 0
    marker_dir: str = ""

    def __call__(self) -> torch.nn.Module:
        model = self.base()
        calls = itertools.count(1)

        def inject(module, args, kwargs) -> None:
            input_ids = kwargs["input_ids"]  # [B, T]
            call = next(calls)
            if self.fault == "value_error" and _holds(input_ids, self.poison):
                raise ValueError(f"injected: the input holds {list(self.poison)}")
            if self.fault == "oom" and input_ids.shape[0] > self.max_rows:
                raise torch.OutOfMemoryError(
                    f"CUDA out of memory (injected: {input_ids.shape[0]} rows, at most {self.max_rows})"
                )
            if self.fault == "hang" and call == self.at_call:
                marker = Path(self.marker_dir) / f"hung-rank{os.environ.get('RANK', '0')}"
                if not marker.exists():
                    marker.touch()
                    time.sleep(3600)

        model.register_forward_pre_hook(inject, with_kwargs=True)
        return model


def _holds(input_ids: torch.Tensor, ids: tuple[int, ...]) -> bool:
    """Whether any row of input_ids [B, T] holds `ids` consecutively."""
    if input_ids.shape[1] < len(ids):
        return False
    windows = input_ids.unfold(1, len(ids), 1)  # [B, T - n + 1, n]
    return bool((windows == torch.tensor(ids, device=input_ids.device)).all(-1).any())
