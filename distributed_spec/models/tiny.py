"""Tiny random Llama models (and a matching character tokenizer) for tests and smoke runs.

    python -c "from distributed_spec.models.tiny import tiny_llama; print(tiny_llama())"

Built in code from a config: nothing is downloaded. A target/draft pair for tests is a tiny target and
a `perturbed_copy` of it (agrees with the target often, but not always), or two independent seeds.
"""

from __future__ import annotations

import copy
import string

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

TINY_SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
TINY_PAD_ID, TINY_EOS_ID, TINY_UNK_ID = 0, 1, 2


def tiny_llama_config(
    vocab_size: int = 64,
    num_layers: int = 2,
    hidden: int = 32,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_position_embeddings: int = 256,
) -> LlamaConfig:
    """A small Llama config; `hidden` must be divisible by `num_heads`."""
    if hidden % num_heads:
        raise ValueError(f"hidden={hidden} must be divisible by num_heads={num_heads}")
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=TINY_PAD_ID,
        bos_token_id=None,
        eos_token_id=TINY_EOS_ID,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )


def tiny_llama(
    vocab_size: int = 64,
    num_layers: int = 2,
    hidden: int = 32,
    seed: int = 0,
    max_position_embeddings: int = 256,
    logit_scale: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> LlamaForCausalLM:
    """A randomly initialised LlamaForCausalLM in eval mode, deterministic in `seed`.

    `logit_scale` multiplies the LM head weights: > 1 makes the next-token distributions peakier
    (random tiny models are otherwise close to uniform, which makes every draft look good).
    """
    config = tiny_llama_config(
        vocab_size=vocab_size,
        num_layers=num_layers,
        hidden=hidden,
        max_position_embeddings=max_position_embeddings,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model.to(dtype).eval()


def perturbed_copy(model: LlamaForCausalLM, noise: float = 0.5, seed: int = 1) -> LlamaForCausalLM:
    """A deep copy of `model` with every weight w replaced by w + noise * std(w) * N(0, 1).

    Used as a draft that agrees with the target sometimes: noise 0 is the target itself (acceptance 1),
    large noise is an unrelated model.
    """
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in draft.parameters():
            scale = noise * (weight.float().std() if weight.numel() > 1 else 1.0)
            perturbation = torch.randn(weight.shape, generator=generator) * scale
            weight.add_(perturbation.to(weight.dtype))
    return draft.eval()


def tiny_tokenizer(vocab_size: int = 64) -> PreTrainedTokenizerFast:
    """A character-level tokenizer with `vocab_size` ids: <pad>=0, <eos>=1, <unk>=2, then characters.

    Characters are lowercase letters, space, digits and punctuation, in that order, as many as fit.
    Decoding concatenates characters, so `decode(encode(text)) == text` for text in the alphabet.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    alphabet = string.ascii_lowercase + " " + string.digits + string.punctuation + string.ascii_uppercase
    num_chars = vocab_size - len(TINY_SPECIAL_TOKENS)
    if num_chars < 1 or num_chars > len(alphabet):
        raise ValueError(f"tiny_tokenizer vocab_size must be in [4, {len(alphabet) + 3}], got {vocab_size}")
    vocab = {token: index for index, token in enumerate(TINY_SPECIAL_TOKENS)}
    for char in alphabet[:num_chars]:
        vocab[char] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
