"""Vocabulary-parallel verification: each tensor-parallel rank holds logits for its slice of V.

The target's LM head is column-parallel (sharded by vocabulary), so rank k sees target logits for
ids [start_k, end_k) only. `verify_vocab_parallel` verifies without gathering them: it all-reduces
the softmax statistics and the on-path probabilities, all-gathers the per-shard residual masses, and
samples the correction or bonus token by choosing a shard by mass and an id inside it with the
shared uniform u, which equals the global inverse CDF of the unsharded reference.
"""

from distributed_spec.verify_parallel.shards import VocabShard, gather_vocab, vocab_shard_range
from distributed_spec.verify_parallel.vocab_parallel import verify_gathered, verify_vocab_parallel

__all__ = ["VocabShard", "gather_vocab", "verify_gathered", "verify_vocab_parallel", "vocab_shard_range"]
