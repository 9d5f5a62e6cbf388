"""Probe: the held-out acceptance of a draft that reads the target's own features (EAGLE-style).

The bundled distilled draft (distributed_spec/distill) sees only tokens and plateaus near 0.28 held-out
acceptance at temperature 1 (issue 6 aims at 0.5). EAGLE (Li et al., arXiv 2401.15077) feeds the draft
the target's last hidden state f_t with the next token x_{t+1}: one decoder layer maps
(f_t, emb(x_{t+1})) to a guess of f_{t+1}, the target's frozen LM head turns it into q(x_{t+2}), and
further draft steps feed the draft its own guessed features. q still depends only on the prefix (the
target's features of verified tokens are a function of them), so block verification stays exact.
This script measures what such a draft reaches on the distillation data before anyone wires it into
the engine (the target shard group would return the features of accepted tokens to the draft actor).

Depth d = the d-th draft token of a block: depth 1 reads the target's true features only, depth d
reads d-1 of its own. `chain_features` computes every depth for every position in one pass per depth
(the streams of EAGLE-3's "training-time test"), trained on depths 1..--train-depth.

    python -m distributed_spec.distill --stages generate --samples-per-prompt 8 --gen-batch-size 64
    python -m research.probe_feature_draft --steps 600     # features, train, eval; prints JSON

Shapes: B sequences, L positions, H hidden, K sub-vocabulary, D depths.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from distributed_spec.distill.data import load_records, right_pad
from distributed_spec.distill.losses import bucket_acceptance, bucket_kl_loss
from distributed_spec.distill.teacher import load_target
from distributed_spec.distill.train import optimizer_step
from distributed_spec.models.distilled import (
    DISTILLED_SMOLLM2_DRAFT_DIR,
    load_distilled_draft,
    read_draft_weights,
)
from distributed_spec.models.fetch import cache_dir

logger = logging.getLogger("probe_feature_draft")


class FeatureDraft(nn.Module):
    """fc([f_t; emb(x_{t+1})]) -> one Llama decoder layer -> RMSNorm = guess of f_{t+1}; q = softmax(head_K(.)).

    Trainable: fc, the layer (initialised from the target's last layer) and the norm (from the target's
    final norm). Frozen and not stored: the target's embeddings and its head rows for the K sub-vocabulary ids.
    """

    def __init__(self, target_model: nn.Module, sub_vocab_ids: torch.Tensor):
        super().__init__()
        config = target_model.config
        hidden, self.head_dim = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        source = target_model.get_decoder().layers[-1]
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        with torch.no_grad():  # start as f + emb: the sum the layer's residual stream carries anyway
            self.fc.weight.copy_(torch.cat([torch.eye(hidden), torch.eye(hidden)], dim=1))
        self.input_norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.post_attention_norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.input_norm.load_state_dict(source.input_layernorm.state_dict())
        self.post_attention_norm.load_state_dict(source.post_attention_layernorm.state_dict())
        self.attn = nn.ModuleDict({n: _copy_linear(getattr(source.self_attn, n)) for n in ("q_proj", "k_proj", "v_proj", "o_proj")})
        self.mlp = nn.ModuleDict({n: _copy_linear(getattr(source.mlp, n)) for n in ("gate_proj", "up_proj", "down_proj")})
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.norm.load_state_dict(target_model.get_decoder().norm.state_dict())
        self.rotary = LlamaRotaryEmbedding(config)
        self.embed_weight = target_model.get_input_embeddings().weight.detach()  # [V, H], frozen
        self.register_buffer("sub_vocab_ids", sub_vocab_ids.long(), persistent=False)
        self.head_weight = target_model.get_output_embeddings().weight.detach()[self.sub_vocab_ids].clone()  # [K, H]

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for name, p in self.named_parameters() if not name.startswith("rotary")]

    def sub_logits(self, features: torch.Tensor) -> torch.Tensor:
        """features [..., H] -> logits over the sub-vocabulary [..., K]."""
        return features @ self.head_weight.T

    def _qkv(self, hidden: torch.Tensor, position_ids: torch.Tensor):
        """hidden [B, L, H] -> (residual input, q [B, h, L, d], k, v [B, h_kv, L, d])."""
        batch, length, _ = hidden.shape
        normed = self.input_norm(hidden)
        split = lambda x, heads: x.view(batch, length, heads, self.head_dim).transpose(1, 2)  # noqa: E731
        q = split(self.attn["q_proj"](normed), self.num_heads)
        k = split(self.attn["k_proj"](normed), self.num_kv_heads)
        v = split(self.attn["v_proj"](normed), self.num_kv_heads)
        cos, sin = self.rotary(hidden, position_ids)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def _finish(self, hidden: torch.Tensor, q, keys, values, mask) -> torch.Tensor:
        """Attention of q over (keys, values) [B, h_kv, S, d] under mask [L, S] (True = attend), MLP, norm."""
        batch, length, _ = hidden.shape
        repeat = self.num_heads // self.num_kv_heads
        attended = F.scaled_dot_product_attention(
            q, keys.repeat_interleave(repeat, 1), values.repeat_interleave(repeat, 1), attn_mask=mask)
        hidden = hidden + self.attn["o_proj"](attended.transpose(1, 2).reshape(batch, length, -1))
        normed = self.post_attention_norm(hidden)
        hidden = hidden + self.mlp["down_proj"](F.silu(self.mlp["gate_proj"](normed)) * self.mlp["up_proj"](normed))
        return self.norm(hidden)

    def chain_features(self, features: torch.Tensor, next_tokens: torch.Tensor, depth: int) -> list[torch.Tensor]:
        """Guessed features at every depth 1..depth, for every position at once.

        features [B, L, H]: the target's f_t; next_tokens [B, L]: x_{t+1}. Returns `depth` tensors
        [B, L, H]; entry s at position t is the draft's guess of f_{t+1} made s steps after the last
        verified feature f_{t-s}: inputs (f_u, x_{u+1}) for u <= t - s, then its own guesses
        (guess of f_u, x_{u+1}) for u = t - s + 1 .. t. Positions t < s have no such chain (garbage).
        """
        batch, length, _ = features.shape
        position_ids = torch.arange(length).expand(batch, length)
        embedded = F.embedding(next_tokens, self.embed_weight)
        rows = torch.arange(length)[:, None]
        cols = torch.arange(length)[None, :]
        keys, values, outputs = [], [], []
        inputs = features
        for s in range(depth):
            hidden = self.fc(torch.cat([inputs, embedded], dim=-1))
            q, k, v = self._qkv(hidden, position_ids)
            keys.append(k)
            values.append(v)
            # Stream s at t sees stream 0 at u <= t - s (true features) and stream j at t - s + j (its chain).
            blocks = [cols <= rows - s] + [cols == rows - s + j for j in range(1, s + 1)]
            mask = torch.cat(blocks, dim=1)
            mask[:, 0] |= ~mask.any(dim=1)  # rows t < s attend to nothing real; keep softmax finite
            out = self._finish(hidden, q, torch.cat(keys, dim=2), torch.cat(values, dim=2), mask)
            outputs.append(out)
            inputs = torch.cat([out.new_zeros(batch, 1, out.shape[-1]), out[:, :-1]], dim=1)  # guess of f_t
        return outputs

    @torch.no_grad()
    def rollout(self, features: torch.Tensor, next_tokens: torch.Tensor, start: int, steps: int) -> list[torch.Tensor]:
        """Reference for chain_features, one chain at a time: the verified prefix is positions 0..start,
        then `steps` draft steps, each on the previous guess. features [1, L, H], next_tokens [1, L].
        Returns `steps` guesses [1, H]: of f_{start+1}, f_{start+2}, ... (next_tokens must reach start+steps-1)."""
        guesses = []
        inputs = features[:, :start + 1]
        tokens = next_tokens[:, :start + 1]
        for step in range(steps):
            hidden = self.fc(torch.cat([inputs, F.embedding(tokens, self.embed_weight)], dim=-1))
            length = hidden.shape[1]
            q, k, v = self._qkv(hidden, torch.arange(length)[None])
            out = self._finish(hidden, q, k, v, torch.ones(length, length, dtype=torch.bool).tril())
            guesses.append(out[:, -1])
            inputs = torch.cat([inputs, out[:, -1:]], dim=1)
            tokens = next_tokens[:, :start + step + 2]
        return guesses


def _copy_linear(layer: nn.Linear) -> nn.Linear:
    copy = nn.Linear(layer.in_features, layer.out_features, bias=False)
    copy.weight.data.copy_(layer.weight.data)
    return copy


# ----------------------------------------------------------------------------- data


@torch.inference_mode()
def target_features(target_model, records: list[dict], batch_size: int = 8,
                    dtype: torch.dtype = torch.float16) -> list[torch.Tensor]:
    """The target's last hidden state (after its final norm: what its LM head reads) per record, [L, H]
    (fp16 to cache the training set; fp32 for eval)."""
    out = []
    decoder = target_model.get_decoder()
    for start in tqdm(range(0, len(records), batch_size), desc="features", unit="batch"):
        chunk = records[start:start + batch_size]
        lengths = [len(r["input_ids"]) for r in chunk]
        ids, mask = right_pad(chunk)
        hidden = decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        out += [hidden[b, :lengths[b]].to(dtype) for b in range(len(chunk))]
    return out


def cached_features(target_model, records: list[dict], path: Path) -> list[torch.Tensor]:
    if path.exists():
        features = torch.load(path, weights_only=True)
        if len(features) == len(records):
            return features
    features = target_features(target_model, records)
    torch.save(features, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").rename(path)
    return features


def make_feature_batch(records: list[dict], features: list[torch.Tensor], vocab_to_sub: torch.Tensor) -> dict:
    """Right-padded: features [B, L, H], next_tokens [B, L] (x_{t+1}); per predicted position (t, predicting
    x_{t+2}) a mask `valid` [B, L] and flattened top-k targets of p(x_{t+2}) (rows of `valid`, row-major),
    true next features [B, L, H] (f_{t+1}), `generated` [B, L] (x_{t+2} was sampled, not prompt)."""
    lengths = [len(r["input_ids"]) for r in records]
    batch, length = len(records), max(lengths)
    hidden = features[0].shape[-1]
    feats = torch.zeros(batch, length, hidden)
    next_feats = torch.zeros(batch, length, hidden)
    next_tokens = torch.zeros(batch, length, dtype=torch.long)
    valid = torch.zeros(batch, length, dtype=torch.bool)
    generated = torch.zeros(batch, length, dtype=torch.bool)
    top_ids, top_probs, rest = [], [], []
    for b, (r, f) in enumerate(zip(records, features)):
        n = lengths[b]
        feats[b, :n] = f.float()
        next_feats[b, :n - 1] = f[1:].float()
        next_tokens[b, :n - 1] = r["input_ids"][1:].long()
        valid[b, :n - 2] = True  # t + 2 <= n - 1
        generated[b, :n - 2] = torch.arange(2, n) >= r["num_prompt_tokens"]
        top_ids.append(r["topk_ids"][1:n - 1])  # row t + 1 = p of x_{t+2}
        top_probs.append(r["topk_probs"][1:n - 1])
        rest.append(r["rest"][1:n - 1])
    return {"features": feats, "next_features": next_feats, "next_tokens": next_tokens, "valid": valid,
            "generated": generated, "sub_ids": vocab_to_sub[torch.cat(top_ids).long()],
            "top_probs": torch.cat(top_probs).float(), "rest": torch.cat(rest).float()}


# ----------------------------------------------------------------------------- train / eval


def train(args, draft: FeatureDraft, records: list[dict], features: list[torch.Tensor], vocab_to_sub) -> None:
    params = draft.trainable_parameters()
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.98))
    logger.info("feature draft: %d trainable parameters, %d training sequences", sum(p.numel() for p in params), len(records))
    draft.train()
    progress = tqdm(range(args.steps), desc="train", unit="step")
    for step in progress:
        order = torch.randperm(len(records), generator=torch.Generator().manual_seed(args.seed * 7919 + step))
        chosen = order[:args.batch_size].tolist()
        batch = make_feature_batch([records[i] for i in chosen], [features[i] for i in chosen], vocab_to_sub)
        guesses = draft.chain_features(batch["features"], batch["next_tokens"], args.train_depth)
        targets = (batch["sub_ids"], batch["top_probs"], batch["rest"])
        loss, accs = 0.0, []
        for s, guess in enumerate(guesses):
            # Depth s + 1 exists at t >= s; its weight halves with depth as in EAGLE-3's later steps.
            keep = batch["valid"] & (torch.arange(guess.shape[1]) >= s)
            rows = keep[batch["valid"]]
            sub_logits = draft.sub_logits(guess[keep])
            picked = tuple(t[rows] for t in targets)
            acceptance = bucket_acceptance(sub_logits, *picked).mean()
            cross_entropy, _ = bucket_kl_loss(sub_logits, *picked)
            regression = F.smooth_l1_loss(guess[keep], batch["next_features"][keep])
            loss = loss + 0.5 ** s * ((1.0 - acceptance) + args.kl_weight * cross_entropy + args.reg_weight * regression)
            accs.append(acceptance.item())
        optimizer_step(optimizer, params, loss, step, args)
        progress.set_postfix(loss=f"{loss.item():.3f}", acc="/".join(f"{a:.3f}" for a in accs))
    draft.eval()


@torch.no_grad()
def evaluate(args, target_model, draft: FeatureDraft, token_draft, records: list[dict], vocab_to_sub) -> dict:
    """Mean sum_x min(p, q) over held-out generated positions, full p (the target's fp32 head on its fp32
    features), per depth, and the token-only draft on the same predicted tokens."""
    features = target_features(target_model, records, dtype=torch.float32)
    head = target_model.get_output_embeddings()
    sums = torch.zeros(args.eval_depth + 1, dtype=torch.float64)
    count = 0
    for start in range(0, len(records), 4):
        chunk, feats = records[start:start + 4], features[start:start + 4]
        batch = make_feature_batch(chunk, feats, vocab_to_sub)
        # Every depth is scored on the same predicted tokens: those with a chain of the deepest depth.
        keep = batch["valid"] & batch["generated"] & (torch.arange(batch["valid"].shape[1]) >= args.eval_depth - 1)
        p = torch.softmax(head(batch["next_features"][keep]).float(), -1)  # [n, V]: p(x_{t+2})
        p_sub = p[:, draft.sub_vocab_ids]
        for s, guess in enumerate(draft.chain_features(batch["features"], batch["next_tokens"], args.eval_depth)):
            q = torch.softmax(draft.sub_logits(guess[keep]).float(), -1)
            sums[s] += torch.minimum(p_sub, q).sum().double()
        ids, mask = right_pad(chunk)
        # The token draft's row t + 1 predicts x_{t+2} from x_{<=t+1}.
        token_logits = token_draft(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, 1:]
        token_keep = keep[:, :token_logits.shape[1]]
        q_token = torch.softmax(token_logits[token_keep].float(), -1)
        sums[-1] += torch.minimum(p, q_token).sum().double()
        count += int(keep.sum())
    mean = (sums / max(1, count)).tolist()
    return {"feature_draft_acceptance_by_depth": [round(a, 4) for a in mean[:-1]],
            "token_draft_acceptance": round(mean[-1], 4), "num_positions": count}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", default=str(cache_dir() / "distill" / "smollm2-draft"), help="distributed_spec.distill shards")
    parser.add_argument("--token-draft", default=str(DISTILLED_SMOLLM2_DRAFT_DIR), help="token-only draft to compare with")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--train-depth", type=int, default=2, help="depths trained on at once (training-time test)")
    parser.add_argument("--eval-depth", type=int, default=4)
    parser.add_argument("--kl-weight", type=float, default=0.1)
    parser.add_argument("--reg-weight", type=float, default=1.0, help="smooth-L1 on the guessed feature")
    parser.add_argument("--max-train-sequences", type=int, default=0, help="0: all")
    parser.add_argument("--eval-train-sequences", type=int, default=64,
                        help="also score this many training sequences with the held-out metric (fit vs generalisation)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="save the trained feature draft's state_dict here")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    torch.manual_seed(args.seed)
    target_model, _ = load_target("smollm2")
    for p in target_model.parameters():
        p.requires_grad_(False)
    _, sub_vocab_ids = read_draft_weights(args.token_draft)
    draft = FeatureDraft(target_model, sub_vocab_ids)
    vocab_to_sub = torch.full((target_model.config.vocab_size,), len(sub_vocab_ids), dtype=torch.long)
    vocab_to_sub[sub_vocab_ids.long()] = torch.arange(len(sub_vocab_ids))
    records = load_records(args.work_dir, "train")
    if args.max_train_sequences:
        records = records[:args.max_train_sequences]
    features = cached_features(target_model, records, Path(args.work_dir) / "features_train.pt")
    begin = time.perf_counter()
    train(args, draft, records, features, vocab_to_sub)
    metrics = {"train_minutes": round((time.perf_counter() - begin) / 60, 1), "steps": args.steps,
               "batch_size": args.batch_size, "train_depth": args.train_depth, "train_sequences": len(records)}
    if args.out:
        torch.save({k: v for k, v in draft.state_dict().items()}, args.out)
    token_draft = load_distilled_draft(args.token_draft, target_model)
    metrics.update(evaluate(args, target_model, draft, token_draft, load_records(args.work_dir, "eval"), vocab_to_sub))
    if args.eval_train_sequences:
        seen = evaluate(args, target_model, draft, token_draft, records[:args.eval_train_sequences], vocab_to_sub)
        metrics["on_training_sequences"] = seen
    print(json.dumps(metrics, indent=2))
    return metrics


if __name__ == "__main__":
    main()
