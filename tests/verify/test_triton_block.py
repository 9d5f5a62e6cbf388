"""The fused Triton verifier (verify/triton_block.py) against the torch reference and the exact oracle.

Triton runs kernels on the CPU only in its interpreter, and TRITON_INTERPRET=1 must be set before
triton is first imported. So without CUDA this module re-runs itself in a subprocess with the
variable set (nothing leaks into the rest of the session); on CUDA (scripts/gpu_check.sh) the tests
run in process on the GPU. The interpreter is slow: sizes stay tiny (V <= 80, B <= 32).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (pip install 'triton>=3.0')")

from distributed_spec.verify import (  # noqa: E402
    SamplingParams,
    VerifyUniforms,
    draw_uniforms,
    logits_to_probs,
    verify,
)
from tests.verify import oracle  # noqa: E402
from tests.verify.batched import dense_table, sample_block_inputs  # noqa: E402
from tests.verify_parallel.outcomes import assert_same_outcomes  # noqa: E402

_IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
_ON_CUDA = torch.cuda.is_available() and not _IN_INTERPRETER
DEVICE = "cuda" if _ON_CUDA else "cpu"
PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=0.7, top_k=8),
    SamplingParams(temperature=1.3, top_p=0.8),
]


# Argument types of each kernel at the engine's sizes (bf16 logits, fp32 draft probabilities).
_STATS_TYPES = {
    "logits_ptr": "*bf16",
    "thresholds_ptr": "*fp32",
    "num_draft_tokens_ptr": "*i64",
    "block_max_ptr": "*fp32",
    "block_sum_ptr": "*fp32",
    "temperature": "fp32",
}
_RESIDUAL_TYPES = {
    **_STATS_TYPES,
    "draft_ids_ptr": "*i64",
    "draft_probs_ptr": "*fp32",
    "eta_ptr": "*fp64",
    "residual_masses_ptr": "*fp32",
}
_SAMPLE_TYPES = {
    **_RESIDUAL_TYPES,
    "u_ptr": "*fp64",
    "accepted_counts_ptr": "*i64",
    "next_tokens_ptr": "*i64",
}


if not (_IN_INTERPRETER or _ON_CUDA):

    @pytest.mark.parametrize("method_id", [0, 1], ids=["block", "token"])
    def test_kernels_compile_for_cuda_without_a_gpu(method_id):
        """The kernels through Triton's whole CUDA pipeline (sm_90: H100/H200) to a cubin, no GPU needed:
        catches what the interpreter does not check (types of loop-carried values, constexpr branches)."""
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, compile

        from distributed_spec.verify import triton_block

        sizes = dict(V=128256, NB=32, GAMMA=4, BLOCK_V=4096)
        kernels = [
            (
                triton_block._residual_block_masses_kernel,
                _RESIDUAL_TYPES,
                dict(sizes, NB_PAD=32, METHOD=method_id),
            ),
            (triton_block._choose_and_sample_kernel, _SAMPLE_TYPES, dict(sizes, NB_PAD=32, METHOD=method_id)),
        ]
        if method_id == 0:
            kernels.append((triton_block._softmax_block_stats_kernel, _STATS_TYPES, sizes))
        for kernel, types, constexprs in kernels:
            signature = {name: types.get(name, "constexpr") for name in kernel.arg_names}
            assert set(signature.values()) - {"constexpr"} and set(types) <= set(signature), kernel.arg_names
            indices = {(kernel.arg_names.index(name),): value for name, value in constexprs.items()}
            compiled = compile(
                ASTSource(fn=kernel, signature=signature, constexprs=indices),
                target=GPUTarget("cuda", 90, 32),
            )
            assert ".entry " + kernel.__name__ in compiled.asm["ptx"]

    def test_kernels_in_the_triton_interpreter():
        """Re-run this module with TRITON_INTERPRET=1 in a fresh process (the CPU path of CI)."""
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        command = [
            sys.executable,
            "-m",
            "pytest",
            __file__,
            "-q",
            "-p",
            "no:cacheprovider",
            "-W",
            "ignore::RuntimeWarning",
        ]
        result = subprocess.run(
            command,
            env=env,
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]

else:
    from distributed_spec.verify.triton_block import fused_available, verify_fused

    def _random_case(generator, batch_size, g, vocab_size, params, dtype=torch.float32):
        """Target logits, draft ids sampled from q (a perturbed warp), ragged n (0 included)."""
        target_logits = (torch.randn(batch_size, g + 1, vocab_size, generator=generator) * 2).to(dtype)
        draft_logits = target_logits[:, :g].float() + torch.randn(
            batch_size, g, vocab_size, generator=generator
        )
        draft_probs = logits_to_probs(draft_logits, params)
        draft_ids = torch.multinomial(draft_probs.reshape(-1, vocab_size), 1, generator=generator).view(
            batch_size, g
        )
        # A few ids the draft could not have sampled: q = 0 (r becomes 1) or p = 0 under top-k.
        draft_ids[0, 0] = int(draft_probs[0, 0].argmin())
        num_draft_tokens = torch.randint(0, g + 1, (batch_size,), generator=generator)
        num_draft_tokens[1] = g
        uniforms = draw_uniforms(batch_size, g, generator)
        return target_logits, draft_ids, draft_probs, num_draft_tokens, uniforms

    def _to_device(*tensors):
        return [t.to(DEVICE) for t in tensors]

    @pytest.mark.parametrize("params", PARAMS, ids=["plain", "temperature-topk", "top-p-fallback"])
    @pytest.mark.parametrize("method", ["block", "token"])
    def test_matches_reference_for_identical_uniforms(method, params):
        """Ragged rows, three vocabulary blocks (the last one partial), warped in and out of the kernel."""
        generator = torch.Generator().manual_seed(10)
        target_logits, draft_ids, draft_probs, num_draft_tokens, uniforms = _random_case(
            generator, 12, 3, 80, params
        )
        target_probs = logits_to_probs(target_logits, params)
        reference = verify(method, draft_ids, draft_probs, target_probs, num_draft_tokens, uniforms)
        output = verify_fused(
            method,
            *_to_device(target_logits, draft_ids, draft_probs, num_draft_tokens),
            VerifyUniforms(*_to_device(uniforms.eta, uniforms.u)),
            params,
            block_size=32,
        )
        assert_same_outcomes(
            method, output, reference, target_probs, draft_ids, draft_probs, num_draft_tokens, uniforms.u
        )

    @pytest.mark.parametrize("method", ["block", "token"])
    def test_decisions_match_oracle(method):
        """tau and Y equal what the exact oracle's h (or acceptance) and residual dictate."""
        generator = torch.Generator().manual_seed(3)
        vocab_size, g, rows_per_table = 5, 3, 8
        cases = []
        for seed in range(4):
            p = oracle.RandomTable(vocab_size, seed=300 + seed, concentration=0.6)
            q = oracle.RandomTable(vocab_size, seed=400 + seed, concentration=0.6)
            inputs = sample_block_inputs(
                dense_table(p, (), vocab_size, g),
                dense_table(q, (), vocab_size, g),
                rows_per_table,
                g,
                generator,
            )
            cases.append((p, q, inputs))
        draft_ids = torch.cat([c[2][0] for c in cases])
        draft_probs = torch.cat([c[2][1] for c in cases])
        target_logits = torch.cat([c[2][2] for c in cases]).log()
        uniforms = draw_uniforms(len(draft_ids), g, generator)
        output = verify_fused(
            method,
            *_to_device(target_logits, draft_ids, draft_probs),
            None,
            VerifyUniforms(*_to_device(uniforms.eta, uniforms.u)),
            SamplingParams(),
            block_size=16,
        )
        taus, tokens = (
            output.accepted_counts.tolist(),
            output.next_tokens.tolist(),
        )  # host sync: checked in Python
        compared = 0
        for row in range(len(draft_ids)):
            p, q, _ = cases[row // rows_per_table]
            tau, y, margin = oracle.decide(
                method, p, q, tuple(draft_ids[row].tolist()), uniforms.eta[row].tolist(), uniforms.u[row].item()
            )
            assert taus[row] == tau, (row, taus[row], tau)
            # Only compare away from a CDF boundary, where float32 inputs could round either way.
            if margin > 1e-5:
                assert tokens[row] == y, (row, tokens[row], y)
                compared += 1
        assert compared >= 0.9 * len(draft_ids)

    def test_bf16_logits_and_no_draft_tokens():
        """bf16 logits (as a model emits them) and rows of n = 0; then g = 0 altogether (bonus only)."""
        generator = torch.Generator().manual_seed(11)
        params = SamplingParams(temperature=0.9)
        target_logits, draft_ids, draft_probs, num_draft_tokens, uniforms = _random_case(
            generator, 6, 2, 48, params, dtype=torch.bfloat16
        )
        num_draft_tokens[2:4] = 0
        target_probs = logits_to_probs(target_logits, params)
        reference = verify("block", draft_ids, draft_probs, target_probs, num_draft_tokens, uniforms)
        output = verify_fused(
            "block",
            *_to_device(target_logits, draft_ids, draft_probs, num_draft_tokens),
            VerifyUniforms(*_to_device(uniforms.eta, uniforms.u)),
            params,
            block_size=16,
        )
        assert_same_outcomes(
            "block", output, reference, target_probs, draft_ids, draft_probs, num_draft_tokens, uniforms.u
        )
        empty = torch.zeros(6, 0, dtype=torch.long)
        no_draft = VerifyUniforms(torch.zeros(6, 0, dtype=torch.float64), uniforms.u)
        reference = verify("block", empty, draft_probs[:, :0], target_probs[:, :1], None, no_draft)
        output = verify_fused(
            "block",
            *_to_device(target_logits[:, :1], empty, draft_probs[:, :0]),
            None,
            VerifyUniforms(*_to_device(no_draft.eta, no_draft.u)),
            params,
            block_size=16,
        )
        assert output.accepted_counts.tolist() == [0] * 6
        assert torch.equal(output.next_tokens.cpu(), reference.next_tokens)

    def test_zero_draft_probability_and_zero_residual_give_valid_tokens():
        """q(X_1) = 0 < p(X_1) gives r_1 = 1; p == q later gives a zero residual mass (h = 1)."""
        target_probs = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.2, 0.3, 0.5]]]).repeat(3, 1, 1)
        draft_probs = torch.tensor([[[1.0, 0.0, 0.0], [0.2, 0.3, 0.5]]]).repeat(3, 1, 1)
        draft_ids = torch.tensor([[1, 2]]).repeat(3, 1)
        eta = torch.tensor([[0.99, 0.99], [0.0, 0.0], [0.5, 0.999]], dtype=torch.float64)
        uniforms = VerifyUniforms(eta, torch.full((3,), 0.999999, dtype=torch.float64))
        for method in ("block", "token"):
            output = verify_fused(
                method,
                *_to_device(target_probs.log(), draft_ids, draft_probs),
                None,
                VerifyUniforms(*_to_device(uniforms.eta, uniforms.u)),
                SamplingParams(),
                block_size=16,
            )
            reference = verify(method, draft_ids, draft_probs, target_probs, None, uniforms)
            assert output.accepted_counts.tolist() == [2, 2, 2]
            assert torch.equal(output.next_tokens.cpu(), reference.next_tokens)

    @pytest.mark.parametrize("bad_value", [float("nan"), float("inf")])
    def test_non_finite_logits_raise(bad_value):
        generator = torch.Generator().manual_seed(6)
        target_logits, draft_ids, draft_probs, _, uniforms = _random_case(
            generator, 2, 2, 16, SamplingParams()
        )
        target_logits[1, 1, 3] = bad_value
        with pytest.raises(ValueError, match="NaN or inf"):
            verify_fused(
                "block",
                *_to_device(target_logits, draft_ids, draft_probs),
                None,
                VerifyUniforms(*_to_device(uniforms.eta, uniforms.u)),
                SamplingParams(),
                block_size=16,
            )

    def test_greedy_runs_the_argmax_rule_and_bad_settings_raise():
        """Temperature 0 (any method) and method "greedy" take the argmax rule on the logits."""
        generator = torch.Generator().manual_seed(7)
        target_logits, draft_ids, draft_probs, num_draft_tokens, uniforms = _random_case(
            generator, 8, 3, 16, SamplingParams()
        )
        draft_ids[:, :2] = target_logits[:, :2].argmax(-1)
        expected = verify("greedy", draft_ids, None, target_logits, num_draft_tokens, None)
        for method, params in (("greedy", SamplingParams()), ("block", SamplingParams(temperature=0.0))):
            output = verify_fused(
                method, target_logits, draft_ids, draft_probs, num_draft_tokens, uniforms, params
            )
            assert torch.equal(output.accepted_counts, expected.accepted_counts)
            assert torch.equal(output.next_tokens, expected.next_tokens)
        with pytest.raises(ValueError, match="verifier.method"):
            verify_fused("typical", target_logits, draft_ids, draft_probs, None, uniforms, SamplingParams())
        with pytest.raises(ValueError, match="block_size"):
            verify_fused(
                "block",
                target_logits,
                draft_ids,
                draft_probs,
                None,
                uniforms,
                SamplingParams(),
                block_size=48,
            )
        assert fused_available("cuda") and not fused_available("cpu")
