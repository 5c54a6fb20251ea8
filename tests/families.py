"""Tiny random models of each family the fast paths run, from transformers' own config classes, and a byte-level BPE
tokenizer whose vocabulary they share (trained here on a few sentences: no download)."""
from __future__ import annotations

from functools import lru_cache

import torch

from tiny import WORDS

VOCAB = 512
PROMPTS = ("the cat sat on the mat and the dog ran to see it",
           'a {"name": "sun", "tags": ["red", "blue"]} is',
           "I was in the house")


@lru_cache(maxsize=1)
def bpe_tokenizer():
    """A byte-level BPE tokenizer of VOCAB tokens (as SmolLM2's and Llama 3's are), EOS </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    corpus = [" ".join(WORDS[(7 * i + 3 * j) % len(WORDS)] for j in range(12)) + f' {{"name": "{WORDS[i % 40]}", '
              f'"age": {i}, "tags": ["a", "b"]}}' for i in range(400)]
    core.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"],
                                                         show_progress=False,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def prompt_ids() -> list[list[int]]:
    tokenizer = bpe_tokenizer()
    return [tokenizer(p)["input_ids"] for p in PROMPTS]


_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.3, tie_word_embeddings=False,
               bos_token_id=None, eos_token_id=None, pad_token_id=None)  # no EOS: outputs run their full length

# variant -> (config class name, its arguments beyond _COMMON)
VARIANTS = {
    "qwen3": ("Qwen3Config", dict(head_dim=32)),
    "qwen3-window": ("Qwen3Config", dict(head_dim=32, use_sliding_window=True, sliding_window=12, max_window_layers=1)),
    "mistral-window": ("MistralConfig", dict(sliding_window=10)),
    "qwen2-window": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=16, max_window_layers=1)),
    "phi3": ("Phi3Config", dict(original_max_position_embeddings=256)),
    # Phi-4-mini's RoPE on part of each head, LongRoPE's short and long factors, and a window (as Phi-3-mini's)
    "phi3-longrope-window": ("Phi3Config", dict(
        original_max_position_embeddings=96, sliding_window=14,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "short_factor": [1.0, 1.3, 1.9, 2.6], "long_factor": [1.5, 2.5, 4.0, 7.0],
                         "original_max_position_embeddings": 96})),
    # alternating windowed and global layers, soft-capped scores and logits, scores scaled by query_pre_attn_scalar
    "gemma2": ("Gemma2Config", dict(head_dim=32, sliding_window=12, query_pre_attn_scalar=24, tie_word_embeddings=True,
                                    attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    # q/k norms, local and global RoPE bases (one global layer in three)
    "gemma3": ("Gemma3TextConfig", dict(head_dim=32, sliding_window=10, query_pre_attn_scalar=48,
                                        tie_word_embeddings=True, sliding_window_pattern=3,
                                        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                         "sliding_attention": {"rope_type": "default",
                                                                               "rope_theta": 1e4}})),
}


def family_model(variant: str, seed: int = 0, dtype: torch.dtype = torch.float32, windows: bool = True):
    """A random causal LM of this variant (VARIANTS), in `dtype`, eval mode; windows False: without its sliding
    window."""
    import transformers

    config_class, extra = VARIANTS[variant]
    if not windows:
        extra = {**extra, "use_sliding_window": False} if "use_sliding_window" in extra else \
            {**extra, "sliding_window": None}
    config = getattr(transformers, config_class)(**{**_COMMON, **extra})
    config._attn_implementation = "eager" if variant == "gemma2" else "sdpa"  # SDPA has no soft-capping
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms start at 1 (Gemma's at 0, for 1 + w): random ones show what scales by what
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.2)
    model.generation_config.eos_token_id = config.eos_token_id
    return model.to(dtype)
