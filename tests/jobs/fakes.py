"""A fake Generator for job tests: deterministic, instant, no model (the real engine has its own tests)."""

from __future__ import annotations

from distributed_spec.engine.config import GenerationResult, RowStats, RunStats
from distributed_spec.models.tiny import TINY_EOS_ID, tiny_tokenizer

CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant: "


def tiny_chat_tokenizer(vocab_size: int = 64):
    """The tiny character tokenizer, plus a chat template so `messages` records work."""
    tokenizer = tiny_tokenizer(vocab_size)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


class FakeGenerator:
    """Echoes the first `max_new_tokens` prompt tokens back; `fail_on` token ids raise."""

    def __init__(
        self,
        g: int = 2,
        max_new_tokens: int = 4,
        max_context_len: int = 64,
        fail_on: int | None = None,
        batch_size: int = 4,
    ):
        self.tokenizer = tiny_chat_tokenizer()
        self.max_context_len = max_context_len
        self.g = g
        self.max_new_tokens = max_new_tokens
        self.fail_on = fail_on
        self.batch_size = batch_size
        # (prompt ids, seed keys) of each batch taken, and every item taken.
        self.calls: list[tuple[list[list[int]], list[str]]] = []
        self.items: list = []
        self.stats = RunStats()
        self.closed = False

    def stream(self, items):
        """Up to `batch_size` items are taken before any result is yielded (like a real batch)."""
        self.stats = RunStats(
            max_num_draft_tokens=self.g,
            num_proposed_per_position=[0] * self.g,
            num_accepted_per_position=[0] * self.g,
            extra={"transfer_s": 0.0},
        )
        items = iter(items)
        while True:
            batch = [item for _, item in zip(range(self.batch_size), items)]
            if not batch:
                return
            prompt_ids = [item.prompt_ids for item in batch]
            self.items.extend(batch)
            self.calls.append((prompt_ids, [item.seed_key for item in batch]))
            if self.fail_on is not None and any(self.fail_on in ids for ids in prompt_ids):
                raise RuntimeError("fake engine failure")
            for item in batch:
                yield item.handle, self._result(item.prompt_ids)

    def _result(self, ids):
        stats = self.stats
        token_ids = list(ids[: self.max_new_tokens])
        finish_reason = "length" if len(token_ids) == self.max_new_tokens else "eos"
        if finish_reason == "eos":
            token_ids.append(TINY_EOS_ID)
        # Two tokens per target call: one accepted draft token plus the correction/bonus.
        num_iterations = (len(token_ids) + 1) // 2
        stats.num_tokens += len(token_ids)
        stats.num_target_calls += num_iterations
        stats.num_row_iterations += num_iterations
        stats.num_proposed_per_position[0] += num_iterations
        stats.num_proposed_per_position[1] += num_iterations
        stats.num_accepted_per_position[0] += len(token_ids) - num_iterations
        stats.draft_s += 0.001
        stats.target_s += 0.002
        stats.verify_s += 0.0005
        stats.extra["transfer_s"] += 0.25
        return GenerationResult(
            token_ids, finish_reason, RowStats(len(token_ids), num_iterations, len(token_ids) - num_iterations)
        )

    def close(self) -> None:
        self.closed = True


def save_tiny_pair(root, vocab_size: int = 64, max_position_embeddings: int = 256):
    """A tiny random target and a perturbed draft saved as safetensors directories (with a chat-template
    tokenizer), for end-to-end runs through the real loader and engine. Returns (target_dir, draft_dir)."""
    from pathlib import Path

    from distributed_spec.models.tiny import perturbed_copy, tiny_llama

    root = Path(root)
    target = tiny_llama(
        vocab_size=vocab_size, seed=0, max_position_embeddings=max_position_embeddings, logit_scale=4.0
    )
    draft = perturbed_copy(target, noise=0.3, seed=1)
    tokenizer = tiny_chat_tokenizer(vocab_size)
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root / "target", root / "draft"
