"""Writes a transformers model and its byte-level BPE tokenizer as a float32 GGUF file (llama.cpp's names, through
the gguf package), for tests that load GGUF files without downloading one."""
from __future__ import annotations

import json
from pathlib import Path

ARCHES = {"qwen3": "QWEN3", "phi3": "PHI3", "gemma2": "GEMMA2"}


def write_gguf(model, tokenizer, path: Path) -> Path:
    import gguf

    cfg = model.config
    arch = cfg.model_type
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if getattr(cfg, "sliding_window", None):
        writer.add_sliding_window(cfg.sliding_window)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = tokenizer.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    specials = set(tokenizer.all_special_tokens)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t in tokens])
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    writer.add_bos_token_id(vocab[tokenizer.bos_token])
    writer.add_eos_token_id(vocab[tokenizer.eos_token])
    writer.add_pad_token_id(vocab[tokenizer.eos_token])  # transformers' Phi-3 reader otherwise assumes id 32000
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, ARCHES[arch]), cfg.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        base, suffix = name.rsplit(".", 1)
        if arch.startswith("gemma") and base.endswith("norm"):
            tensor = tensor + 1  # llama.cpp stores Gemma's norms as 1 + w (transformers' reader subtracts the 1)
        writer.add_tensor(f"{names.get_name(base)}.{suffix}", tensor.float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
