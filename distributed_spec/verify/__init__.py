"""Verification of draft blocks: pure tensor math (probabilities, ids, uniforms in; counts, tokens out).

No model, Ray, Hydra or logging imports here; see rules.py for the terms and the algorithms.
"""

from distributed_spec.verify.from_logits import verify_logits
from distributed_spec.verify.multipath import (
    MultiPathUniforms,
    MultiPathVerifyOutput,
    draw_multipath_uniforms,
    verify_multipath,
    verify_multipath_greedy,
    verify_paths,
)
from distributed_spec.verify.rules import (
    VERIFY_METHODS,
    VerifyOutput,
    VerifyUniforms,
    block_acceptance_probs,
    block_accepted_counts,
    draw_uniforms,
    verify,
    verify_block,
    verify_greedy,
    verify_token,
)
from distributed_spec.verify.sampling import (
    RowSampling,
    Sampling,
    SamplingParams,
    logits_to_probs,
    sample_from_probs,
)

__all__ = [
    "VERIFY_METHODS",
    "MultiPathUniforms",
    "MultiPathVerifyOutput",
    "RowSampling",
    "Sampling",
    "SamplingParams",
    "VerifyOutput",
    "VerifyUniforms",
    "block_acceptance_probs",
    "block_accepted_counts",
    "draw_multipath_uniforms",
    "draw_uniforms",
    "logits_to_probs",
    "sample_from_probs",
    "verify",
    "verify_block",
    "verify_greedy",
    "verify_logits",
    "verify_multipath",
    "verify_multipath_greedy",
    "verify_paths",
    "verify_token",
]
