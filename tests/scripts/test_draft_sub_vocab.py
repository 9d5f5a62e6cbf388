"""scripts/draft_sub_vocab.py: the draft's head widened with the target's own rows.

.venv/bin/python -m pytest tests/scripts/test_draft_sub_vocab.py -q
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from distributed_spec.models.distilled import build_draft, draft_llama_config
from scripts.draft_sub_vocab import widen_head, widened_ids

STORED = torch.arange(0, 40, 2)  # a checkpoint's 20 even ids


def test_widening_keeps_the_stored_ids_first_then_the_lowest_others():
    assert widened_ids(STORED, 64, 26).tolist() == STORED.tolist() + [1, 3, 5, 7, 9, 11]
    assert widened_ids(STORED, 64, 20).tolist() == STORED.tolist()
    assert sorted(widened_ids(STORED, 64, 64).tolist()) == list(range(64))


def test_a_widened_head_scores_the_stored_tokens_as_before_and_the_others_through_the_targets_rows():
    torch.manual_seed(0)
    target = LlamaForCausalLM(LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
    )).eval()
    draft = build_draft(target, draft_llama_config(target.config, 1, 32), STORED).eval()
    input_ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    head = target.get_output_embeddings().weight.detach()
    with torch.no_grad():
        narrow = draft(input_ids=input_ids).logits
        widen_head(draft, head, widened_ids(STORED, 64, 26))
        wide = draft(input_ids=input_ids).logits
        hidden = draft.model(input_ids=input_ids).last_hidden_state
    extra = [1, 3, 5, 7, 9, 11]
    torch.testing.assert_close(wide[..., STORED], narrow[..., STORED])
    torch.testing.assert_close(wide[..., extra], hidden @ head[extra].T)
    assert torch.isinf(wide).sum(-1).eq(64 - 26).all()  # q = 0 outside the 26 tokens
