"""Writes a transformers model and its byte-level BPE tokenizer as a GGUF file (llama.cpp's names, through the gguf
package), for tests that load GGUF files without downloading one: float32, or with its matrices quantized to the
types the gguf package quantizes (Q8_0, Q4_0, Q4_1, Q5_0...) and the K-quants specdec.benchmarks.gguf_file writes (Q4_K,
Q5_K, Q6_K); Llama's q and k rows permuted as llama.cpp's converter permutes them."""
from __future__ import annotations

import json
from pathlib import Path

from specdec.benchmarks.gguf_file import quantize_tensor

ARCHES = {"qwen3": "QWEN3", "phi3": "PHI3", "gemma2": "GEMMA2", "llama": "LLAMA", "qwen2": "QWEN2"}


def _permute(w, heads: int):
    """llama.cpp's convert_hf_to_gguf permute of q and k rows (transformers' GGUF reader undoes it)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, tokenizer, path: Path, quant: dict | None = None) -> Path:
    """quant: GGUF type name by llama.cpp tensor-name substring ("ffn_down": "Q4_0", "": "Q8_0" for every matrix);
    the first key found in a matrix's name decides; norms and vectors stay float32."""
    import gguf
    import numpy as np

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
        values = tensor.float().numpy()
        if arch == "llama" and base.endswith(("q_proj", "k_proj")):
            heads = cfg.num_attention_heads if base.endswith("q_proj") else cfg.num_key_value_heads
            values = _permute(values, heads)
        gguf_name = f"{names.get_name(base)}.{suffix}"
        kind = next((k for key, k in (quant or {}).items() if key in gguf_name), None) if values.ndim == 2 else None
        if kind and kind != "F32":
            qtype = gguf.GGMLQuantizationType[kind]
            writer.add_tensor(gguf_name, quantize_tensor(np.ascontiguousarray(values), kind), raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
