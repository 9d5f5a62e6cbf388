"""Distil a small draft model for a target that shares its tokenizer, from text the target generates.

    python -m distributed_spec.distill --target smollm2 --out-dir distributed_spec/assets/drafts/smollm2-draft
    python -m distributed_spec.distill --target smollm2 --out-dir distributed_spec/assets/drafts/smollm2-draft --eval-only

Stages (--stages), working in --work-dir (default ~/.cache/distributed_spec/distill/<out-dir name>):
0. questions (only when named, with --num-questions N): the target writes N user requests itself
   into work_dir/questions_seed<seed>.txt, to pass to generate as --prompts (new contexts).
1. generate: the target continues every seed prompt (distributed_spec/distill/prompts.txt) at temperature 1,
   batched; per position we keep the target's top-k probabilities p and the rest mass, one shard
   per batch (existing shards are skipped; --seed/--shard-prefix add another round of samples).
   Every 8th prompt is held out for evaluation.
1b. draft-samples (only when named): the draft in --sampler-from writes the continuations instead
   (at temperature 1, batched; cheap), and the target scores each whole sequence in one forward
   (about 2.5x the generated tokens/s of target sampling on 2 CPU cores): on-policy data, the contexts
   the draft itself produces (DistillSpec, Zhou et al. 2024). Same shard format, prefix "draft_" by default.
2. train: the draft (distributed_spec.models.distilled: a few Llama layers on the target's frozen
   embeddings and LM head, optionally a sub-vocabulary head of the K tokens with most target mass)
   minimises forward KL(p || q) over the buckets {top-k tokens it can score} + {everything else},
   or with --tv-weight w a mix with the total variation 1 - sum min(p, q) that acceptance pays for.
   Checkpoints every --save-every steps; --resume continues from the last one.
3. export: bf16 weights + draft_config.json into --out-dir (what load_distilled_draft reads).
4. eval: token-level acceptance, mean over held-out positions of sum_x min(p(x), q(x)) with the
   full p and q at temperature 1, and the per-token cost of draft vs target at batch 1.
   --eval-only runs just this stage (generating the held-out samples first when no shards exist).
--init-from DIR starts training from an exported draft of the same shape (a warm start).

Modules: data (prompt files, shards, batches), teacher (what the target writes and scores), losses
(the KL and total-variation terms), train, evaluate, cli (the options; `__main__` runs it).
"""
