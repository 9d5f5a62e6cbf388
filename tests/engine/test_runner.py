"""ModelRunner: rollback, holes, compaction and dropped rows give the logits of a fresh forward.

.venv/bin/python -m pytest tests/engine/test_runner.py -q
"""

from __future__ import annotations

import torch

from distributed_spec.engine import ModelRunner
from distributed_spec.models.tiny import tiny_llama

ATOL = 1e-5


def _fresh_last_logits(model, token_ids: list[int]) -> torch.Tensor:
    """[V] logits after `token_ids`, from one forward over exactly those tokens (no cache)."""
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0, -1]


def test_rollback_after_rejection_matches_fresh_forward():
    model = tiny_llama(vocab_size=32, seed=3)
    runner = ModelRunner(model)
    prompts = [[4, 5, 6, 7, 8], [9, 10]]
    runner.prefill(prompts)
    block = torch.tensor([[11, 12, 13, 14], [15, 16, 17, 18]])  # [B, g+1]
    runner.forward_tokens(block)
    # Row 0 keeps 2 of 4 (rejection at the 2nd draft), row 1 keeps all 4.
    runner.rollback(torch.tensor([2, 4]), num_new_slots=4)
    next_ids = torch.tensor([[20], [21]])
    logits = runner.forward_tokens(next_ids)[:, 0]  # [B, V]
    kept = [prompts[0] + [11, 12, 20], prompts[1] + [15, 16, 17, 18, 21]]
    for row in range(2):
        torch.testing.assert_close(logits[row], _fresh_last_logits(model, kept[row]), atol=ATOL, rtol=0)
    assert runner.num_kept_tokens().tolist() == [len(kept[0]), len(kept[1])]


def test_holes_compaction_and_dropped_rows_keep_logits_exact():
    model = tiny_llama(vocab_size=32, seed=4)
    # compact_fraction=1.0: never compacts by itself, so the holes stay until compact() below.
    runner = ModelRunner(model, compact_fraction=1.0)
    histories = [[3, 4, 5], [6], [7, 8, 9, 10, 11, 12]]
    runner.prefill(histories)
    generator = torch.Generator().manual_seed(0)
    for step in range(6):
        block = torch.randint(3, 32, (runner.batch_size, 3), generator=generator)
        num_kept = torch.randint(0, 4, (runner.batch_size,), generator=generator)
        runner.forward_tokens(block)
        runner.rollback(num_kept, num_new_slots=3)
        for row, history in enumerate(histories):
            history.extend(block[row, : num_kept[row]].tolist())
        if step == 2:
            runner.drop_rows(torch.tensor([2, 0]))
            histories = [histories[2], histories[0]]
    assert runner.num_slots > max(len(history) for history in histories)
    probe = torch.tensor([[13], [14]])
    with_holes = runner.forward_tokens(probe)[:, 0]
    runner.rollback(torch.zeros(2, dtype=torch.long), num_new_slots=1)
    runner.compact()
    assert runner.num_slots == max(len(history) for history in histories)
    compacted = runner.forward_tokens(probe)[:, 0]
    for row, history in enumerate(histories):
        fresh = _fresh_last_logits(model, history + [probe[row, 0].item()])
        torch.testing.assert_close(with_holes[row], fresh, atol=ATOL, rtol=0)
        torch.testing.assert_close(compacted[row], fresh, atol=ATOL, rtol=0)


def test_masked_input_slots_are_invisible():
    model = tiny_llama(vocab_size=32, seed=5)
    runner = ModelRunner(model)
    runner.prefill([[3, 4], [5]])
    # Row 1 feeds a padding slot first: [pad, 9] must act like feeding [9] alone.
    logits = runner.forward_tokens(torch.tensor([[8, 9], [0, 9]]), torch.tensor([[1, 1], [0, 1]]))[:, -1]
    torch.testing.assert_close(logits[0], _fresh_last_logits(model, [3, 4, 8, 9]), atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[1], _fresh_last_logits(model, [5, 9]), atol=ATOL, rtol=0)


def test_num_logits_gives_the_last_logits_and_a_dense_lm_head_input():
    model = tiny_llama(vocab_size=32, seed=5)
    head_inputs = []
    hook = model.get_output_embeddings().register_forward_pre_hook(lambda module, args: head_inputs.append(args[0]))
    prompts = [[4, 5, 6, 7, 8, 9], [10, 11, 12]]
    runner = ModelRunner(model)
    last = runner.prefill(prompts)  # num_logits=1
    block = torch.tensor([[13, 14, 15], [16, 17, 18]])
    last_two = runner.forward_tokens(block, num_logits=2)  # [B, 2, V]
    hook.remove()
    for row, prompt in enumerate(prompts):
        torch.testing.assert_close(last[row], _fresh_last_logits(model, prompt), atol=ATOL, rtol=0)
        torch.testing.assert_close(
            last_two[row, 0], _fresh_last_logits(model, prompt + block[row, :2].tolist()), atol=ATOL, rtol=0
        )
    assert last_two.shape == (2, 2, 32)
    # A strided view of [B, n, hidden] would send a bf16 CPU head down a weight-copying batched matmul.
    for hidden in head_inputs:
        assert hidden.shape[1] in (1, 2)
        assert hidden.stride() == torch.empty(hidden.shape).stride()


def test_started_prompts_go_in_with_the_first_forward():
    model = tiny_llama(vocab_size=32, seed=6)
    prompts = [[4, 5, 6, 7], [], [8, 9, 10, 11, 12, 13]]
    block = torch.tensor([[14, 15, 16], [17, 18, 19], [20, 21, 22]])  # [B, g+1]
    prefilled = ModelRunner(model)
    prefilled.prefill(prompts)
    expected = prefilled.forward_tokens(block)  # [B, 3, V]
    started = ModelRunner(model)
    started.start(prompts)
    assert started.num_forward_calls == 0 and started.num_slots == 0
    logits = started.forward_tokens(block)
    assert started.num_forward_calls == 1
    assert logits.shape == (3, 3, 32)
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)
    assert started.num_kept_tokens().tolist() == [len(prompt) + 3 for prompt in prompts]
    # The staged prompts precede the block: rollback counts the block's slots only.
    started.rollback(torch.tensor([1, 3, 2]), num_new_slots=3)
    probe = started.forward_tokens(torch.tensor([[23], [24], [25]]), num_logits=1)[:, 0]
    kept = [prompts[0] + [14, 23], prompts[1] + [17, 18, 19, 24], prompts[2] + [20, 21, 25]]
    for row in range(3):
        torch.testing.assert_close(probe[row], _fresh_last_logits(model, kept[row]), atol=ATOL, rtol=0)


def test_rows_dropped_before_the_first_forward_leave_the_staged_prompts():
    model = tiny_llama(vocab_size=32, seed=7)
    runner = ModelRunner(model)
    runner.start([[3, 4, 5], [6, 7], [8]])
    runner.drop_rows(torch.tensor([2, 0]))
    logits = runner.forward_tokens(torch.tensor([[9], [10]]), num_logits=1)[:, 0]
    torch.testing.assert_close(logits[0], _fresh_last_logits(model, [8, 9]), atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[1], _fresh_last_logits(model, [3, 4, 5, 10]), atol=ATOL, rtol=0)


def test_new_rows_prefilled_apart_match_the_shared_forward(monkeypatch):
    """A row joining a running batch: its prompt in a forward of its own (keys and values placed in
    its padding slots) gives the logits of a fresh forward, now and after later blocks."""
    model = tiny_llama(vocab_size=32, seed=8)
    long_prompt = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    for min_slots, expected_forwards in ((0, 3), (10**9, 2)):
        monkeypatch.setattr(ModelRunner, "prefill_apart_min_slots", min_slots)
        runner = ModelRunner(model)
        runner.start([[4, 5], [6, 7, 8]])
        runner.forward_tokens(torch.tensor([[9], [10]]))
        # One short and one longer-than-the-cache prompt join; the running rows feed one token each.
        runner.add_rows([[15, 16], long_prompt])
        logits = runner.forward_tokens(torch.tensor([[17], [18], [19], [20]]), num_logits=1)[:, 0]
        assert runner.num_forward_calls == expected_forwards
        kept = [[4, 5, 9, 17], [6, 7, 8, 10, 18], [15, 16, 19], long_prompt + [20]]
        for row in range(4):
            torch.testing.assert_close(logits[row], _fresh_last_logits(model, kept[row]), atol=ATOL, rtol=0)
        runner.rollback(torch.tensor([1, 1, 0, 1]), num_new_slots=1)
        probe = runner.forward_tokens(torch.tensor([[21], [22], [23], [24]]), num_logits=1)[:, 0]
        kept = [kept[0] + [21], kept[1] + [22], [15, 16, 23], kept[3] + [24]]
        for row in range(4):
            torch.testing.assert_close(probe[row], _fresh_last_logits(model, kept[row]), atol=ATOL, rtol=0)
def test_forked_rows_give_the_logits_of_the_original_row():
    """fork_rows repeats rows (holes and staged tokens included); each copy then continues on its own."""
    model = tiny_llama(vocab_size=32, seed=8)
    runner = ModelRunner(model, compact_fraction=1.0)
    runner.prefill([[3, 4, 5, 6], [7, 8]])
    runner.forward_tokens(torch.tensor([[9, 10, 11], [12, 13, 14]]))
    runner.rollback(torch.tensor([1, 3]), num_new_slots=3)  # row 0 now has a hole of 2 slots
    runner.add_rows([[15, 16, 17]])  # row 2: a staged prompt, nothing cached yet
    histories = [[3, 4, 5, 6, 9], [7, 8, 12, 13, 14], [15, 16, 17]]
    runner.fork_rows(torch.tensor([0, 0, 0, 1, 1, 2, 2]))
    assert runner.batch_size == 7 and runner.num_staged_tokens() == [0, 0, 0, 0, 0, 3, 3]
    probe = torch.tensor([[20], [21], [22], [23], [24], [25], [26]])
    logits = runner.forward_tokens(probe, num_logits=1)[:, 0]
    for row, origin in enumerate([0, 0, 0, 1, 1, 2, 2]):
        expected = _fresh_last_logits(model, histories[origin] + [probe[row, 0].item()])
        torch.testing.assert_close(logits[row], expected, atol=ATOL, rtol=0)
    # Keep one copy per original row (as after multi-path verification): each holds its own path.
    runner.fork_rows(torch.tensor([2, 3, 6]))
    logits = runner.forward_tokens(torch.tensor([[27], [28], [29]]), num_logits=1)[:, 0]
    kept = [histories[0] + [22, 27], histories[1] + [23, 28], histories[2] + [26, 29]]
    for row in range(3):
        torch.testing.assert_close(logits[row], _fresh_last_logits(model, kept[row]), atol=ATOL, rtol=0)


def test_rows_without_slots_outlive_the_rows_that_had_them():
    """Rows that joined but were never fed (the draft idles through autoregressive steps) stay after
    every row holding slots has left: the cache, compacted to no slot at all, must follow the batch
    through later drops (transformers skips batch_select_indices on an empty cache) so the next
    forward is exact."""
    model = tiny_llama(vocab_size=32, seed=6)
    runner = ModelRunner(model)
    runner.prefill([[4, 5, 6], [7, 8]])
    runner.add_rows([[9, 10, 11], [12, 13]])  # staged only
    runner.drop_rows(torch.tensor([2, 3]))  # the fed rows leave: no kept slot remains
    runner.drop_rows(torch.tensor([1]))
    logits = runner.forward_tokens(torch.tensor([[14]]))[:, 0]
    torch.testing.assert_close(logits[0], _fresh_last_logits(model, [12, 13, 14]), atol=ATOL, rtol=0)
