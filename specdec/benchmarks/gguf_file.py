"""A transformers Llama-family model (a random-weight shape or a tiny test model) written as a real GGUF file in
llama.cpp's quantized formats, so that specdec's quantized-GGUF loader and native llama.cpp (llama-bench) run the
very same bytes.

The file is what llama.cpp's convert_hf_to_gguf.py followed by llama-quantize would make: llama.cpp's tensor names
and hyper-parameters, Llama's q/k rows permuted, and llama-quantize's choice of type per tensor (`tensor_type`).
Q4_0, Q4_1, Q5_0 and Q8_0 come from the gguf package's quantizers (bit-exact to ggml's reference ones); the gguf
package has none for Q4_K, Q5_K and Q6_K, so k_quants.py has simple ones (see there).

What the file does not carry: Llama 3's rope scaling (llama.cpp's rope_freqs tensor; transformers' GGUF reader
ignores it, so both engines run plain RoPE with the model's theta) and any sliding window.
"""

from __future__ import annotations

import numpy as np

from .k_quants import QK_K, quantize_q4_k, quantize_q5_k, quantize_q6_k

ARCHES = {"llama": "LLAMA", "qwen2": "QWEN2", "qwen3": "QWEN3"}
QUANTS = {  # quant name -> (general.file_type, the type of most 2-D weights)
    "F32": ("ALL_F32", "F32"),
    "Q8_0": ("MOSTLY_Q8_0", "Q8_0"),
    "Q4_0": ("MOSTLY_Q4_0", "Q4_0"),
    "Q4_1": ("MOSTLY_Q4_1", "Q4_1"),
    "Q4_K_M": ("MOSTLY_Q4_K_M", "Q4_K"),
    "Q5_K_M": ("MOSTLY_Q5_K_M", "Q5_K"),
}


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's layers (of n) whose attn_v and ffn_down Q4_K_M stores in Q6_K: the first and last eighth, and
    every third layer between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(
    name: str, shape: tuple[int, ...], quant: str, n_layers: int, tied: bool, k_fallback: str = "Q5_0"
) -> str:
    """The GGML type llama-quantize (src/llama-quant.cpp, llama_tensor_get_type) gives tensor `name` of a dense
    Llama-family model, shape (rows, K) as transformers holds it, in file type `quant` (a QUANTS key); `tied`:
    the file has no output.weight, so token_embd is also the output layer. A type whose blocks do not divide K
    falls back as llama.cpp's do: Q6_K to Q8_0, Q4_K to `k_fallback` (Q5_0 in llama.cpp; a reader without Q5_0
    may ask for Q8_0 or Q4_0), a 32-block type to F16."""
    import gguf

    base = QUANTS[quant][1]
    if base == "F32" or len(shape) < 2 or not name.endswith("weight") or "_norm.weight" in name:
        return "F32"  # llama-quantize quantizes only 2-D weights, never the norms
    k = shape[-1]
    block = (
        QK_K if base in ("Q4_K", "Q5_K") else 32
    )  # the file type's own blocks, which llama.cpp tests the output layer by
    kind = name.split(".")[-2]
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    new = base
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        # the output layer (or the embedding that is it): Q6_K, unless the file is Q8_0 already or K does
        # not fit the file's blocks
        new = "Q8_0" if k % block or base == "Q8_0" else "Q6_K"
    elif base in ("Q4_K", "Q5_K") and kind in ("attn_v", "ffn_down") and use_more_bits(layer, n_layers):
        new = "Q6_K"
    if new in ("Q4_K", "Q5_K", "Q6_K") and k % QK_K:
        new = {"Q4_K": k_fallback, "Q5_K": "Q5_1" if k_fallback == "Q5_0" else k_fallback}.get(new, "Q8_0")
    if k % gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, new)][0]:
        new = "F16"  # llama.cpp's last resort: "must use F16 due to unusual shape"
    return new


def quantize_tensor(w: np.ndarray, type_name: str) -> np.ndarray:
    """float32 (rows, K) -> the tensor's data in GGML type `type_name`: raw blocks (uint8) or floats."""
    import gguf

    if type_name == "Q4_K":
        return quantize_q4_k(w)
    if type_name == "Q5_K":
        return quantize_q5_k(w)
    if type_name == "Q6_K":
        return quantize_q6_k(w)
    if type_name == "F16":
        return w.astype(np.float16)
    return gguf.quants.quantize(w, getattr(gguf.GGMLQuantizationType, type_name))


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's spelling of the 256 bytes as printable characters (byte-level BPE vocabularies are written so)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(moved)}}


def _write_vocab(writer, tokenizer, vocab_size: int) -> None:
    """The tokenizer's byte-level BPE vocabulary (tests/gguf_writer.py's way), or with none a minimal one that
    transformers and llama.cpp both accept: the 256 byte tokens, "ĠĠ" (the one merge: the gguf package cannot
    write an empty merges list, and transformers' BPE wants every merge's result in the vocabulary), NORMAL
    filler tokens "<t{i}>" (USER_DEFINED ones would make transformers add 128k added tokens) up to the model's
    vocabulary, and CONTROL BOS and EOS last; EOS is GPT-2's "<|endoftext|>", which transformers' GPT2Tokenizer
    would otherwise add as a token beyond the vocabulary."""
    import json

    import gguf

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    if tokenizer is not None:
        vocab = tokenizer.get_vocab()
        tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
        specials = set(tokenizer.all_special_tokens)
        types = [gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t in tokens]
        merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
        merges = [" ".join(m) if isinstance(m, list) else m for m in merges]
        bos, eos = vocab[tokenizer.bos_token or tokenizer.eos_token], vocab[tokenizer.eos_token]
    else:
        if vocab_size < 259:
            raise ValueError(f"a made-up vocabulary needs at least 259 tokens, not {vocab_size}")
        space = _bytes_to_unicode()[ord(" ")]
        tokens = [
            *_bytes_to_unicode().values(),
            space * 2,
            *(f"<t{i}>" for i in range(257, vocab_size - 2)),
            "<|begin_of_text|>",
            "<|endoftext|>",
        ]
        types = [gguf.TokenType.NORMAL] * (vocab_size - 2) + [gguf.TokenType.CONTROL] * 2
        merges, bos, eos = [f"{space} {space}"], vocab_size - 2, vocab_size - 1
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.add_pad_token_id(eos)


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute of q (n_head heads) or k (n_kv_head) rows: HF's rotate-half
    pairs (i, i + d/2) of each head become llama.cpp's adjacent pairs (2i, 2i + 1); transformers' GGUF reader
    undoes it."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf_model(model, path, quant: str, tokenizer=None, k_fallback: str = "Q5_0") -> dict[str, str]:
    """Writes `model` (a transformers LlamaForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM) to `path` as a
    GGUF file of file type `quant` (F32, Q8_0, Q4_0, Q4_1 or Q4_K_M; tensor_type says each tensor's type) with
    `tokenizer`'s vocabulary (a byte-level BPE PreTrainedTokenizerFast) or, with None, a made-up one of the
    model's vocab_size. Returns each written tensor's GGML type by llama.cpp name."""
    import gguf

    cfg = model.config
    arch = cfg.model_type
    if arch not in ARCHES:
        raise ValueError(f"model_type {arch!r} is not one of {', '.join(ARCHES)}")
    if quant not in QUANTS:
        raise ValueError(f"quant {quant!r} is not one of {', '.join(QUANTS)}")
    n_layers, n_head, n_kv = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_head
    rope = getattr(cfg, "rope_parameters", None) or {}
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_file_type(getattr(gguf.LlamaFileType, QUANTS[quant][0]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _write_vocab(writer, tokenizer, cfg.vocab_size)

    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, ARCHES[arch]), n_layers)
    state = model.state_dict()
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    if tied:
        state.pop("lm_head.weight", None)  # llama.cpp writes no output.weight for a tied model
    types = {}
    for hf_name, tensor in state.items():
        base, suffix = hf_name.rsplit(".", 1)
        gguf_base = names.get_name(base)
        if gguf_base is None:
            raise ValueError(f"no llama.cpp name for tensor {hf_name}")
        name = f"{gguf_base}.{suffix}"
        w = tensor.detach().float().cpu().numpy()
        if arch == "llama" and base.endswith(("q_proj", "k_proj")):
            w = permute(w, n_head if base.endswith("q_proj") else n_kv)
        types[name] = tensor_type(name, w.shape, quant, n_layers, tied, k_fallback)
        data = quantize_tensor(w, types[name]) if types[name] != "F32" else w
        writer.add_tensor(name, data, raw_dtype=getattr(gguf.GGMLQuantizationType, types[name]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return types
