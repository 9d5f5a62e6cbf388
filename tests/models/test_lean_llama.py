"""models/lean_llama.py: the draft's plain-torch forward computes what transformers' forward does.

    .venv/bin/python -m pytest tests/models/test_lean_llama.py -q
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from distributed_spec.engine import ModelRunner
from distributed_spec.models import lean_llama
from distributed_spec.models.distilled import build_draft, draft_llama_config

VOCAB_SIZE = 64


def _draft(dtype: torch.dtype = torch.float32, hidden_act: str = "silu"):
    """A sub-vocabulary draft (2 layers, grouped-query attention) on a tiny random target."""
    torch.manual_seed(0)
    target = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, hidden_act=hidden_act,
    )).eval()
    draft = build_draft(target, draft_llama_config(target.config, 2, 48), torch.arange(0, 48))
    # Random layers (build_draft copies none of the target's): nothing is special about the weights.
    for param in draft.model.layers.parameters():
        param.data.normal_(0.0, 0.2)
    return draft.to(dtype).eval()


def _scripted_run(draft, lean: bool) -> list[torch.Tensor]:
    """The engine's verbs on ragged rows: staged prompts of different lengths, blocks with padding
    slots, a rollback that leaves holes, a row joining a running batch, a dropped row. Returns each
    forward's logits at real slots (padding slots' logits mean nothing)."""
    draft.lean_forward = lean
    runner = ModelRunner(draft)
    generator = torch.Generator().manual_seed(1)
    outputs = []

    def forward(input_ids, input_mask=None, max_staged=None):
        logits = runner.forward_tokens(input_ids, input_mask, max_staged=max_staged)
        mask = torch.ones_like(input_ids, dtype=torch.bool) if input_mask is None else input_mask.bool()
        outputs.append(logits[mask].float())

    runner.start([[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18]])
    forward(torch.randint(3, VOCAB_SIZE, (3, 3), generator=generator), max_staged=4)  # chunked prompts
    forward(torch.randint(3, VOCAB_SIZE, (3, 3), generator=generator))
    runner.rollback(torch.tensor([3, 0, 1]), 3)  # holes: rows keep 3, 0 and 1 of the 3 new slots
    forward(torch.randint(3, VOCAB_SIZE, (3, 2), generator=generator), torch.tensor([[1, 1], [1, 0], [0, 0]]))
    runner.add_rows([[20, 21, 22, 23]])  # joins the running batch
    forward(torch.randint(3, VOCAB_SIZE, (4, 2), generator=generator))
    runner.drop_rows(torch.tensor([0, 2, 3]))
    forward(torch.randint(3, VOCAB_SIZE, (3, 4), generator=generator))
    return outputs


def test_the_engines_calls_give_the_logits_of_transformers_forward():
    draft = _draft()
    calls = []
    real = lean_llama.decoder_forward

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    lean_llama_forward = pytest.MonkeyPatch()
    lean_llama_forward.setattr("distributed_spec.models.distilled.decoder_forward", counted)
    try:
        lean = _scripted_run(draft, lean=True)
    finally:
        lean_llama_forward.undo()
    reference = _scripted_run(draft, lean=False)
    assert len(calls) == len(lean), "the engine's calls did not take the lean forward"
    for got, want in zip(lean, reference):
        assert torch.isfinite(got[torch.isfinite(want)]).all()
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_bfloat16_logits_agree_with_transformers_to_bf16_rounding():
    draft = _draft(torch.bfloat16)
    for got, want in zip(_scripted_run(draft, lean=True), _scripted_run(draft, lean=False)):
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(got))  # the same sub-vocabulary, -inf elsewhere
        torch.testing.assert_close(got[finite], want[finite], atol=0.05, rtol=0.02)


def test_a_model_it_does_not_compute_goes_through_transformers(monkeypatch):
    draft = _draft(hidden_act="gelu")
    assert not lean_llama.supports_lean_forward(draft.config)
    monkeypatch.setattr(
        "distributed_spec.models.distilled.decoder_forward",
        lambda *args, **kwargs: pytest.fail("the lean forward ran on a GELU model"),
    )
    _scripted_run(draft, lean=True)


def test_a_padding_query_sees_its_own_slot_only_when_nothing_else():
    slot_mask = torch.tensor([[0, 0, 1, 1, 0], [1, 1, 1, 0, 1]])
    mask = lean_llama.slot_attention_mask(slot_mask, num_new=2)  # queries at slots 3 and 4
    assert mask.shape == (2, 1, 2, 5)
    # Row 0: slot 3 is kept and sees slots 2-3; slot 4 is padding and sees the kept slots before it
    # plus itself (never an empty row: softmax over nothing is NaN).
    assert mask[0, 0].tolist() == [[False, False, True, True, False], [False, False, True, True, True]]
    assert mask[1, 0].tolist() == [[True, True, True, True, False], [True, True, True, False, True]]
