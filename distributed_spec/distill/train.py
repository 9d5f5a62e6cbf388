"""Stage train: the draft learns the target's next-token distribution from the stored records."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch
from tqdm import tqdm

from distributed_spec.distill.data import load_records, make_batch
from distributed_spec.distill.losses import distill_loss
from distributed_spec.models.distilled import (
    build_draft,
    draft_llama_config,
    read_draft_weights,
    trainable_state_dict,
)

logger = logging.getLogger("distributed_spec.distill")


def choose_sub_vocab(records: list[dict], vocab_size: int, size: int) -> torch.Tensor | None:
    """The `size` token ids with the most target probability mass over the records ([K] long, sorted), or None."""
    if size <= 0 or size >= vocab_size:
        return None
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    for r in records:
        mass.index_add_(0, r["topk_ids"].flatten().long(), r["topk_probs"].flatten().double())
    return mass.topk(size).indices.sort().values


def init_from_target(draft, target_model, layer_spec: str) -> None:
    """Copy target decoder layers into the draft's (MLP neurons pruned to the draft's width) and its final norm.

    layer_spec: "none", or one target layer index per draft layer ("first"/"last" allowed), e.g. "first,last".
    Pruning keeps the intermediate neurons j with the largest |gate_j| * |up_j| * |down_:,j|.
    """
    if layer_spec == "none":
        return
    target_layers = target_model.get_decoder().layers
    names = [name.strip() for name in layer_spec.split(",")]
    if len(names) != len(draft.model.layers):
        raise ValueError(f"--init-layers names {len(names)} layers but the draft has {len(draft.model.layers)}: "
                         "give one target layer per draft layer, or 'none'")
    index = {"first": 0, "last": len(target_layers) - 1}
    with torch.no_grad():
        for draft_layer, name in zip(draft.model.layers, names):
            source = target_layers[index[name] if name in index else int(name)].state_dict()
            own = draft_layer.state_dict()
            gate, up, down = (source[f"mlp.{n}_proj.weight"] for n in ("gate", "up", "down"))
            width = own["mlp.gate_proj.weight"].shape[0]
            keep = (gate.norm(dim=1) * up.norm(dim=1) * down.norm(dim=0)).topk(width).indices.sort().values
            source.update({"mlp.gate_proj.weight": gate[keep], "mlp.up_proj.weight": up[keep],
                           "mlp.down_proj.weight": down[:, keep]})
            draft_layer.load_state_dict({name: source[name] for name in own})
        draft.model.norm.load_state_dict(target_model.get_decoder().norm.state_dict())


def draft_sub_logits(draft, input_ids: torch.Tensor, attention_mask: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Draft logits over its own output set at the valid positions: [n, K] (K = V for a full-vocabulary head)."""
    hidden = draft.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    return draft.lm_head(hidden[valid])


def vocab_to_sub_table(draft) -> torch.Tensor:
    """[V] long: token id -> index in the draft's output set, K (one past the end) for tokens outside it."""
    vocab_size = draft.config.vocab_size
    sub_vocab_ids = getattr(draft, "sub_vocab_ids", None)
    if sub_vocab_ids is None:
        return torch.arange(vocab_size)
    table = torch.full((vocab_size,), len(sub_vocab_ids), dtype=torch.long)
    table[sub_vocab_ids.cpu()] = torch.arange(len(sub_vocab_ids))
    return table


def lr_at(step: int, args) -> float:
    """Linear warmup, then cosine decay to 10% of --lr at --steps."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    progress = min(1.0, (step - args.warmup_steps) / max(1, args.steps - args.warmup_steps))
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def optimizer_step(optimizer, params, loss: torch.Tensor, step: int, args) -> None:
    """One clipped AdamW step on `loss` at the schedule's learning rate for `step`."""
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step, args)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()


def run_train(args, target_model):
    """Stage 2: train the draft; checkpoints work_dir/train_state.pt every --save-every steps."""
    records = load_records(args.work_dir, "train")
    state_path = Path(args.work_dir) / "train_state.pt"
    state = torch.load(state_path, weights_only=True) if args.resume and state_path.exists() else None
    initial, initial_sub_vocab = (None, None) if state is not None or not args.init_from else read_draft_weights(args.init_from)
    if state is not None and not args.refresh_sub_vocab:
        sub_vocab_ids = state["sub_vocab_ids"]
    elif initial is not None and not args.refresh_sub_vocab and initial_sub_vocab is not None:
        sub_vocab_ids = initial_sub_vocab.long()
    else:
        sub_vocab_ids = choose_sub_vocab(records, target_model.config.vocab_size, args.sub_vocab_size)
    config = draft_llama_config(target_model.config, args.num_layers, args.intermediate_size)
    draft = build_draft(target_model, config, sub_vocab_ids)
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.98))
    start = 0
    if state is not None:
        draft.load_state_dict(state["draft"], strict=False)
        optimizer.load_state_dict(state["optimizer"])
        if args.refresh_sub_vocab:
            logger.info("sub-vocabulary chosen again from %d sequences", len(records))
        start = state["step"]
        logger.info("resumed from %s at step %d", state_path, start)
    elif initial is not None:
        # Warm start from an exported draft of the same shape (its stored layers; the head rows are the target's).
        with torch.no_grad():
            for name, tensor in trainable_state_dict(draft).items():
                tensor.copy_(initial[name])
        logger.info("initialised from the exported draft in %s", args.init_from)
    else:
        init_from_target(draft, target_model, args.init_layers)
    vocab_to_sub = vocab_to_sub_table(draft)
    logger.info("draft: %d trainable parameters, output set %d tokens, %d training sequences",
                sum(p.numel() for p in params), int(vocab_to_sub.max()) if sub_vocab_ids is not None
                else config.vocab_size, len(records))
    draft.train()
    progress = tqdm(range(start, args.steps), desc="train", unit="step", initial=start, total=args.steps)
    for step in progress:
        if args.reload_data_every and step > start and step % args.reload_data_every == 0:
            records = load_records(args.work_dir, "train")
        # The batch depends only on (seed, step) and the shards present: a resumed run sees the same data.
        order = torch.randperm(len(records), generator=torch.Generator().manual_seed(args.seed * 7919 + step))
        batch = make_batch([records[i] for i in order[:args.batch_size].tolist()], vocab_to_sub)
        sub_logits = draft_sub_logits(draft, batch["input_ids"], batch["attention_mask"], batch["valid"])
        targets = (batch["sub_ids"], batch["top_probs"], batch["rest"])
        loss, kl, acceptance = distill_loss(sub_logits, *targets, args.tv_weight)
        optimizer_step(optimizer, params, loss, step, args)
        # .item(): the progress bar shows the loss; one sync per step is negligible next to the step itself.
        progress.set_postfix(loss=f"{loss.item():.3f}", kl=f"{kl.item():.3f}", acc=f"{acceptance.item():.3f}")
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            save_train_state(state_path, draft, optimizer, step + 1)
    return draft.eval()


def save_train_state(path: Path, draft, optimizer, step: int) -> None:
    """Atomically write the trainable weights, optimizer state and step."""
    state = {"draft": trainable_state_dict(draft), "optimizer": optimizer.state_dict(), "step": step,
             "sub_vocab_ids": getattr(draft, "sub_vocab_ids", None)}
    torch.save(state, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").rename(path)


def restore_draft(args, target_model):
    """The draft in work_dir/train_state.pt (for --stages export without train)."""
    state = torch.load(Path(args.work_dir) / "train_state.pt", weights_only=True)
    config = draft_llama_config(target_model.config, args.num_layers, args.intermediate_size)
    draft = build_draft(target_model, config, state["sub_vocab_ids"])
    draft.load_state_dict(state["draft"], strict=False)
    return draft.eval()
