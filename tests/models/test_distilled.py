"""Distilled drafts: the distillation CLI (distributed_spec.distill) end to end on a tiny random target, the loader, the bundled draft.

    .venv/bin/python -m pytest tests/models/test_distilled.py -q
"""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from distributed_spec.distill import cli, data, losses, teacher
from distributed_spec.engine import ModelRunner
from distributed_spec.models.distilled import (
    DISTILLED_SMOLLM2_DRAFT_DIR,
    build_draft,
    draft_llama_config,
    load_distilled_draft,
    read_draft_weights,
    save_distilled_draft,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
VOCAB_SIZE = 64
CHARS = " abcdefghijklmnopqrstuvwxyz0123456789.,?!'"


def _tiny_target() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval()


def _save_tiny_target(path: Path) -> Path:
    """A tiny random Llama and a character-level tokenizer (vocab 64) saved as a model dir."""
    _tiny_target().save_pretrained(path)
    vocab = {"[PAD]": 0, "[BOS]": 1, "[EOS]": 2, "[UNK]": 3}
    vocab.update({c: 4 + i for i, c in enumerate(CHARS)})
    vocab.update({f"[X{i}]": i for i in range(len(vocab), VOCAB_SIZE)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]"
    ).save_pretrained(path)
    return path


def _assert_incremental_matches_full(draft, input_ids: torch.Tensor, num_incremental: int) -> None:
    """Prefill all but the last tokens, then decode them one by one with the KV cache: same logits as a full pass."""
    with torch.no_grad():
        full_logits = draft(input_ids=input_ids, use_cache=False).logits
        prefix = input_ids.shape[1] - num_incremental
        outputs = draft(input_ids=input_ids[:, :prefix], use_cache=True)
        step_logits = [outputs.logits]
        cache_name = "cache" if "cache" in outputs else "past_key_values"
        for t in range(prefix, input_ids.shape[1]):
            outputs = draft(input_ids=input_ids[:, t:t + 1], use_cache=True, **{cache_name: outputs[cache_name]})
            step_logits.append(outputs.logits)
    torch.testing.assert_close(torch.cat(step_logits, dim=1), full_logits, atol=1e-5, rtol=1e-5)


def test_script_trains_resumes_exports_and_evaluates(tmp_path):
    target_dir = _save_tiny_target(tmp_path / "target")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("# tiny\n" + "".join(f"raw\tprompt number {i} says hello\n" for i in range(8)))
    common = [
        "--target", str(target_dir), "--out-dir", str(tmp_path / "draft"), "--work-dir", str(tmp_path / "work"),
        "--prompts", str(prompts), "--samples-per-prompt", "2", "--eval-samples-per-prompt", "2",
        "--max-new-tokens", "12", "--gen-batch-size", "5", "--store-top-k", "8",
        "--num-layers", "2", "--intermediate-size", "16", "--sub-vocab-size", "40", "--init-layers", "first,last",
        "--batch-size", "4", "--save-every", "2", "--bench-tokens", "2", "--lr", "3e-3", "--warmup-steps", "1",
    ]
    cli.main([*common, "--steps", "4", "--stages", "generate,train"])
    shards = sorted((tmp_path / "work" / "data").glob("shard_*.pt"))
    assert len(shards) == 4  # 7 train prompts x 2 + 1 eval prompt x 2 = 16 jobs in batches of 5
    records = [r for shard in shards for r in torch.load(shard, weights_only=True)]
    assert sorted(r["split"] for r in records).count("eval") == 2
    for r in records:
        assert r["topk_ids"].shape == (len(r["input_ids"]) - 1, 8)
        assert torch.all(r["topk_probs"].float().sum(-1) + r["rest"] <= 1.0 + 1e-2)
    state = torch.load(tmp_path / "work" / "train_state.pt", weights_only=True)
    assert state["step"] == 4 and state["sub_vocab_ids"].numel() == 40

    metrics = cli.main([*common, "--steps", "6", "--resume", "--stages", "train,export,eval"])
    resumed = torch.load(tmp_path / "work" / "train_state.pt", weights_only=True)
    assert resumed["step"] == 6
    assert any(not torch.equal(resumed["draft"][k], state["draft"][k]) for k in state["draft"])
    assert 0.0 < metrics["acceptance_generated"] <= 1.0
    assert 0.0 < metrics["output_set_coverage"] <= 1.0 + 1e-6
    assert metrics["draft_ms_per_token"] > 0
    meta = json.loads((tmp_path / "draft" / "draft_config.json").read_text())
    assert meta["sub_vocab_size"] == 40 and "--resume" in meta["made_by"]

    # Warm start: a new work dir whose training starts from the exported draft (lr 0: unchanged weights).
    exported = load_file(str(tmp_path / "draft" / "model.safetensors"))
    warm = [*common, "--work-dir", str(tmp_path / "warm"), "--init-from", str(tmp_path / "draft")]
    shutil.copytree(tmp_path / "work" / "data", tmp_path / "warm" / "data")
    cli.main([*warm, "--steps", "1", "--lr", "0", "--stages", "train"])
    started = torch.load(tmp_path / "warm" / "train_state.pt", weights_only=True)
    assert torch.equal(started["sub_vocab_ids"].int(), exported["sub_vocab_ids"])
    for name, tensor in started["draft"].items():
        assert torch.equal(tensor.to(torch.bfloat16), exported[name]), name

    # An int8 export of the same training state warm-starts from its dequantized weights.
    cli.main([*common, "--stages", "export", "--out-dir", str(tmp_path / "draft8"), "--weight-format", "int8"])
    dequantized, _ = read_draft_weights(tmp_path / "draft8")
    assert load_file(str(tmp_path / "draft8" / "model.safetensors"))["model.layers.0.mlp.up_proj.weight"].dtype == torch.int8
    shutil.copytree(tmp_path / "work" / "data", tmp_path / "warm8" / "data")
    cli.main([*warm, "--work-dir", str(tmp_path / "warm8"), "--init-from", str(tmp_path / "draft8"),
                 "--steps", "1", "--lr", "0", "--stages", "train"])
    started8 = torch.load(tmp_path / "warm8" / "train_state.pt", weights_only=True)
    for name, tensor in started8["draft"].items():
        assert torch.equal(tensor, dequantized[name]), name

    # On-policy data: the exported draft writes continuations of the training prompts, the target scores them.
    cli.main([*common, "--stages", "draft-samples", "--sampler-from", str(tmp_path / "draft"), "--seed", "3"])
    draft_shards = sorted((tmp_path / "work" / "data").glob("draft_shard_*.pt"))
    assert len(draft_shards) == 3  # 7 training prompts x 2 samples in batches of 5; the held-out prompt is skipped
    draft_records = [r for shard in draft_shards for r in torch.load(shard, weights_only=True)]
    assert sorted((r["prompt_index"], r["sample_index"]) for r in draft_records) == [
        (i, s) for i in range(7) for s in range(2)]
    target = LlamaForCausalLM.from_pretrained(target_dir).eval()
    sub_vocab = set(load_file(str(tmp_path / "draft" / "model.safetensors"))["sub_vocab_ids"].tolist())
    for r in draft_records:
        assert r["split"] == "train"
        continuation = r["input_ids"][r["num_prompt_tokens"]:].tolist()
        assert 0 < len(continuation) <= 12 and (continuation[-1] == 2 or len(continuation) == 12)
        assert set(continuation) <= sub_vocab  # sampled from the draft: q = 0 outside its sub-vocabulary
        with torch.no_grad():  # alone and unpadded, the target gives the stored p
            p = torch.softmax(target(input_ids=r["input_ids"][None].long()).logits[0, :-1], -1)
        top_probs, top_ids = p.topk(8, -1)
        assert torch.equal(r["topk_ids"], top_ids.int())
        torch.testing.assert_close(r["topk_probs"].float(), top_probs, atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(r["rest"], 1 - top_probs.sum(-1), atol=1e-5, rtol=1e-5)
    with pytest.raises(SystemExit):  # draft-samples without a draft to sample from
        cli.parse_args([*common, "--stages", "draft-samples"])

    draft = load_distilled_draft(tmp_path / "draft", target)
    assert len(draft.model.layers) == 2
    assert draft.model.embed_tokens.weight is target.get_input_embeddings().weight
    input_ids = torch.randint(4, VOCAB_SIZE, (2, 9), generator=torch.Generator().manual_seed(1))
    logits = draft(input_ids=input_ids).logits
    assert logits.shape == (2, 9, VOCAB_SIZE)
    assert torch.isinf(logits).sum(-1).eq(VOCAB_SIZE - 40).all()  # q = 0 outside the sub-vocabulary
    _assert_incremental_matches_full(draft, input_ids, num_incremental=4)


@pytest.mark.parametrize("sub_vocab_size", [0, 24])
def test_save_load_roundtrip_and_kv_cache(tmp_path, sub_vocab_size):
    target = _tiny_target()
    config = draft_llama_config(target.config, num_hidden_layers=1, intermediate_size=16)
    sub_vocab_ids = torch.arange(0, 2 * sub_vocab_size, 2) if sub_vocab_size else None
    draft = build_draft(target, config, sub_vocab_ids)
    save_distilled_draft(draft, tmp_path)
    loaded = load_distilled_draft(tmp_path, target)
    assert isinstance(loaded, LlamaForCausalLM)
    for name, tensor in loaded.model.layers.state_dict().items():  # bf16 on disk
        torch.testing.assert_close(tensor, draft.model.layers.state_dict()[name].bfloat16().float())
    input_ids = torch.randint(0, VOCAB_SIZE, (3, 7), generator=torch.Generator().manual_seed(2))
    assert loaded(input_ids=input_ids).logits.shape == (3, 7, VOCAB_SIZE)
    _assert_incremental_matches_full(loaded, input_ids, num_incremental=3)


def test_int8_export_stores_int8_matrices_and_loads_within_half_a_step(tmp_path):
    target = _tiny_target()
    draft = build_draft(target, draft_llama_config(target.config, 2, 16), torch.arange(0, 48, 2))
    save_distilled_draft(draft, tmp_path / "bf16")
    save_distilled_draft(draft, tmp_path / "int8", weight_format="int8")
    stored = load_file(str(tmp_path / "int8" / "model.safetensors"))
    own = {name: t for name, t in draft.state_dict().items() if name.startswith("model.layers.")}
    for name, tensor in own.items():
        assert stored[name].dtype == (torch.int8 if tensor.dim() == 2 else torch.bfloat16)
    loaded = load_distilled_draft(tmp_path / "int8", target)
    for name, tensor in loaded.state_dict().items():
        if name in own and own[name].dim() == 2:
            # Symmetric rounding: every weight within half a quantization step of its own row.
            step = own[name].abs().amax(dim=1, keepdim=True) / 127
            assert ((tensor - own[name]).abs() <= step / 2 + 1e-7).all(), name
    assert json.loads((tmp_path / "int8" / "draft_config.json").read_text())["weight_format"] == "int8"
    # The matrices are the bulk of the bytes: int8 stores close to half of bf16.
    sizes = {fmt: (tmp_path / fmt / "model.safetensors").stat().st_size for fmt in ("bf16", "int8")}
    assert sizes["int8"] < 0.75 * sizes["bf16"]
    with pytest.raises(ValueError, match="weight_format"):
        save_distilled_draft(draft, tmp_path / "x", weight_format="int4")


def test_runner_passes_the_cache_under_the_name_the_base_model_takes():
    """The sub-vocabulary draft's forward takes **kwargs: the runner must not fall back to the
    deprecated `past_key_values` when the base model takes `cache` (transformers 5.x)."""
    target = _tiny_target()
    draft = build_draft(target, draft_llama_config(target.config, 1, 16), torch.arange(0, 48, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        runner = ModelRunner(draft)
        runner.prefill([[3, 4, 5]])
        assert runner.forward_tokens(torch.tensor([[6, 7]])).shape == (1, 2, VOCAB_SIZE)


def test_load_rejects_a_draft_made_for_another_target(tmp_path):
    target = _tiny_target()
    save_distilled_draft(build_draft(target, draft_llama_config(target.config, 1, 16)), tmp_path)
    other = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB_SIZE * 2, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=4))
    with pytest.raises(ValueError, match="choose the draft checkpoint"):
        load_distilled_draft(tmp_path, other)


def test_bundled_smollm2_draft_is_small_and_loads():
    files = [f for f in DISTILLED_SMOLLM2_DRAFT_DIR.iterdir() if f.is_file()]
    assert {"draft_config.json", "model.safetensors", "README.md"} <= {f.name for f in files}
    assert sum(f.stat().st_size for f in files) < 10_000_000
    from transformers import AutoModelForCausalLM

    from distributed_spec.models.fetch import smollm2_gguf_path

    path = smollm2_gguf_path()
    target = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    draft = load_distilled_draft(DISTILLED_SMOLLM2_DRAFT_DIR, target)
    input_ids = torch.tensor([[1, 9690, 198, 2683, 314, 253]])
    with torch.no_grad():
        logits = draft(input_ids=input_ids).logits
    assert logits.shape == (1, 6, target.config.vocab_size)
    assert torch.isfinite(torch.logsumexp(logits, -1)).all()


def _bucket_oracle(p: torch.Tensor, q: torch.Tensor, top_ids: list[int], scorable: set[int]):
    """(sum min, KL) over buckets {each top-k token the draft scores} + {the rest}, by enumeration over the vocabulary."""
    singles = [t for t in top_ids if t in scorable]
    buckets = [[t] for t in singles] + [[t for t in range(len(p)) if t not in singles]]
    p_b = [float(sum(p[t] for t in b)) for b in buckets]
    q_b = [float(sum(q[t] for t in b)) for b in buckets]
    overlap = sum(min(a, b) for a, b in zip(p_b, q_b))
    kl = sum(a * math.log(a / b) for a, b in zip(p_b, q_b) if a > 0)
    return overlap, kl


@pytest.mark.parametrize("top_k, num_sub", [(12, 12), (5, 8), (4, 12)])
def test_bucket_losses_match_enumeration(top_k, num_sub):
    """bucket_acceptance and bucket_kl_loss against the buckets summed token by token (vocab 12); with
    all tokens in the top-k and the sub-vocabulary, bucket acceptance is the exact sum_x min(p, q)."""
    vocab, generator = 12, torch.Generator().manual_seed(3)
    sub_vocab_ids = torch.randperm(vocab, generator=generator)[:num_sub].sort().values
    vocab_to_sub = torch.full((vocab,), num_sub, dtype=torch.long)
    vocab_to_sub[sub_vocab_ids] = torch.arange(num_sub)
    p = torch.softmax(2 * torch.randn(6, vocab, generator=generator, dtype=torch.float64), -1)
    sub_logits = torch.randn(6, num_sub, generator=generator, dtype=torch.float64)
    q = torch.zeros(6, vocab, dtype=torch.float64)
    q[:, sub_vocab_ids] = torch.softmax(sub_logits, -1)
    top_probs, top_ids = p.topk(top_k, -1)
    rest = 1.0 - top_probs.sum(-1)
    targets = (vocab_to_sub[top_ids], top_probs, rest)
    overlap = losses.bucket_acceptance(sub_logits, *targets)
    cross_entropy, kl = losses.bucket_kl_loss(sub_logits, *targets)
    oracle = [_bucket_oracle(p[n], q[n], top_ids[n].tolist(), set(sub_vocab_ids.tolist())) for n in range(6)]
    torch.testing.assert_close(overlap, torch.tensor([o for o, _ in oracle], dtype=overlap.dtype), atol=1e-5, rtol=0)
    assert kl.item() == pytest.approx(sum(k for _, k in oracle) / 6, abs=1e-4)
    if top_k == num_sub == vocab:
        torch.testing.assert_close(overlap, torch.minimum(p, q).sum(-1).to(overlap.dtype))
    else:
        assert torch.all(overlap >= torch.minimum(p, q).sum(-1) - 1e-6)  # merging tokens only raises the overlap


def test_prompt_files_keep_one_prompt_per_line_whatever_the_text_holds(tmp_path):
    """Generated text holds U+2028, tabs and CR: the questions file must still read back one prompt per line
    (str.splitlines once split a target-written question at a U+2028 and broke the next stage)."""
    texts = ["plain", "two\nlines", "tab\there", "line\u2028separator", "page\x0cbreak", "cr\rlf\r\nend", "a\x85b"]
    path = tmp_path / "prompts.txt"
    data.write_prompts(path, [("chat", t) for t in texts], "written by a test")
    assert data.read_prompts(path) == [("chat", t.replace("\r\n", "\n").replace("\r", "\n").replace("\t", " "))
                                         for t in texts]
    path.write_bytes(b"# a file saved with CRLF line ends\r\nraw\tone\r\nchat\ttwo\r\n")
    assert data.read_prompts(path) == [("raw", "one"), ("chat", "two")]
    path.write_text("chat\tfine\nno tab here\n")
    with pytest.raises(ValueError, match=r"prompts.txt:2: expected"):
        data.read_prompts(path)


def test_questions_stage_writes_a_prompt_file_that_the_next_stage_reads(tmp_path):
    """--stages questions: the target completes user turns from the fixed openings; the file it writes is
    read back by --prompts with one chat prompt per finished turn, each starting with its opening."""
    target_dir = _save_tiny_target(tmp_path / "target")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(target_dir)
    tokenizer.chat_template = "{% for m in messages %}user: {{ m['content'] }}[EOS]{% endfor %}"
    tokenizer.save_pretrained(target_dir)
    cli.main(["--target", str(target_dir), "--work-dir", str(tmp_path / "work"), "--stages", "questions",
                 "--num-questions", "40", "--question-tokens", "40", "--gen-batch-size", "16", "--seed", "2"])
    prompts = data.read_prompts(tmp_path / "work" / "questions_seed2.txt")
    assert 0 < len(prompts) <= 40 and all(kind == "chat" for kind, _ in prompts)
    assert all(text.startswith(teacher.QUESTION_OPENINGS) and len(text) > 8 for _, text in prompts)


def test_draft_samples_come_from_the_whole_distribution():
    """The draft-samples stage samples at temperature 1 with no top-k, even where the model's own
    generation config asks for one: a uniform model must give far more than top_k distinct tokens."""
    model = _tiny_target()
    # Near-uniform p over the 64 tokens, with no ties (a top-k of tied logits would keep them all).
    model.lm_head.weight = torch.nn.Parameter(1e-4 * torch.randn(VOCAB_SIZE, 32, generator=torch.Generator().manual_seed(0)))
    model.generation_config.top_k = 5
    continuations = teacher.sample_continuations(model, [[1, 5, 6]] * 256, 1, eos_token_id=2, pad_token_id=0, seed=0)
    assert all(len(c) == 1 for c in continuations)
    assert len({c[0] for c in continuations}) > 40  # 256 uniform draws over 64 tokens: ~63 distinct


def test_tv_loss_step_raises_acceptance():
    """One gradient step on 1 - bucket_acceptance moves q toward p (the loss of --tv-weight 1)."""
    generator = torch.Generator().manual_seed(4)
    p = torch.softmax(torch.randn(8, 10, generator=generator), -1)
    top_probs, top_ids = p.topk(10, -1)
    targets = (top_ids, top_probs, torch.zeros(8))
    sub_logits = torch.randn(8, 10, generator=generator, requires_grad=True)
    before = losses.bucket_acceptance(sub_logits, *targets)
    (1.0 - before).sum().backward()
    with torch.no_grad():
        after = losses.bucket_acceptance(sub_logits - 1.0 * sub_logits.grad, *targets)
    assert torch.all(after > before.detach())


def test_grown_draft_computes_what_the_original_computes(tmp_path):
    """research/grow_draft.py inserts identity layers: same logits as the original, more layers to train."""
    from research.grow_draft import grow_draft

    target = _tiny_target()
    draft = build_draft(target, draft_llama_config(target.config, 2, 16), torch.arange(0, 48, 2))
    with torch.no_grad():
        for parameter in draft.model.layers.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    save_distilled_draft(draft, tmp_path / "small")
    assert grow_draft(tmp_path / "small", tmp_path / "grown", target, insert_at=1, new_layers="0,2") == 4
    small, grown = load_distilled_draft(tmp_path / "small", target), load_distilled_draft(tmp_path / "grown", target)
    assert len(grown.model.layers) == 4
    assert not torch.equal(grown.model.layers[1].mlp.up_proj.weight, torch.zeros_like(grown.model.layers[1].mlp.up_proj.weight))
    input_ids = torch.randint(0, VOCAB_SIZE, (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(grown(input_ids=input_ids).logits, small(input_ids=input_ids).logits, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="insert-at"):
        grow_draft(tmp_path / "small", tmp_path / "bad", target, insert_at=3, new_layers="0")
