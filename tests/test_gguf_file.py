"""specdec.benchmarks.gguf_file: llama.cpp's Q4_K and Q6_K blocks as the gguf package reads them, llama-quantize's mix of
types, and models written in them that transformers' GGUF reader loads back (Llama's q/k permutation undone)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from specdec.benchmarks.gguf_file import permute, tensor_type, write_gguf_model  # noqa: E402
from specdec.benchmarks.k_quants import quantize_q4_k, quantize_q5_k, quantize_q6_k  # noqa: E402

T = gguf.GGMLQuantizationType


def _weights(rows=64, k=512, seed=0) -> np.ndarray:
    """Gaussian rows of a few scales, an all-positive row, an all-negative one and a zero row."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, k)).astype(np.float32) * np.geomspace(1e-3, 1.0, rows, dtype=np.float32)[:, None]
    w[1] = np.abs(w[1]) + 0.5
    w[2] = -np.abs(w[2]) - 0.5
    w[3] = 0
    return w


@pytest.mark.parametrize("quantize, qtype, block_bytes, rel_rms", [(quantize_q4_k, T.Q4_K, 144, 0.09),
                                                                   (quantize_q5_k, T.Q5_K, 176, 0.045),
                                                                   (quantize_q6_k, T.Q6_K, 210, 0.025)])
def test_k_quants_round_trip_through_gguf_dequantize(quantize, qtype, block_bytes, rel_rms):
    w = _weights()
    raw = quantize(w)
    assert raw.dtype == np.uint8 and raw.shape == (64, 512 // 256 * block_bytes)
    assert gguf.GGML_QUANT_SIZES[qtype] == (256, block_bytes)
    back = gguf.quants.dequantize(raw, qtype)
    assert back.shape == w.shape and (back[3] == 0).all()
    err = back - w
    # per row (rows differ in scale by 1000x): relative RMS error, and no weight off by more than a few steps
    rms = np.sqrt((err ** 2).mean(1) / (w ** 2).mean(1).clip(1e-30))
    assert (rms[w.any(1)] < rel_rms).all(), rms.max()
    # a row's coarsest step: Q4_K's 16 levels span min(w, 0)..max(w), Q6_K's -32..31 reach -max|w|..max|w|
    step = (w.max(1) - np.minimum(w.min(1), 0)) / 15 if qtype == T.Q4_K else np.abs(w).max(1) / 32
    assert (np.abs(err).max(1) <= 1.5 * step + 1e-7).all()


def test_q4_k_is_at_least_as_close_as_q4_0():
    w = _weights()
    q4_k = gguf.quants.dequantize(quantize_q4_k(w), T.Q4_K)
    q4_0 = gguf.quants.dequantize(gguf.quants.quantize(w, T.Q4_0), T.Q4_0)
    assert ((q4_k - w) ** 2).sum() < ((q4_0 - w) ** 2).sum()


def test_k_quants_need_rows_of_256():
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize_q4_k(np.zeros((2, 288), np.float32))


def test_q4_k_m_mix_is_llama_quantizes():
    """llama-quantize's Q4_K_M on Llama-3.2-1B (16 layers): attn_v and ffn_down in Q6_K in layers 0, 1, 4, 7, 10,
    13, 14, 15; the tied embedding (the output layer) in Q6_K; the rest Q4_K, norms F32."""
    more = [i for i in range(16) if tensor_type(f"blk.{i}.attn_v.weight", (512, 2048), "Q4_K_M", 16, True) == "Q6_K"]
    assert more == [0, 1, 4, 7, 10, 13, 14, 15]
    assert tensor_type("blk.4.ffn_down.weight", (2048, 8192), "Q4_K_M", 16, True) == "Q6_K"
    assert tensor_type("blk.5.ffn_down.weight", (2048, 8192), "Q4_K_M", 16, True) == "Q4_K"
    assert tensor_type("blk.0.attn_q.weight", (2048, 2048), "Q4_K_M", 16, True) == "Q4_K"
    assert tensor_type("token_embd.weight", (128256, 2048), "Q4_K_M", 16, True) == "Q6_K"
    assert tensor_type("token_embd.weight", (128256, 2048), "Q4_K_M", 16, False) == "Q4_K"
    assert tensor_type("blk.0.attn_norm.weight", (2048,), "Q4_K_M", 16, True) == "F32"
    # Q5_K_M: the same mix around Q5_K, which falls back to Q5_1 where K is not a multiple of 256
    assert tensor_type("blk.4.ffn_down.weight", (2048, 8192), "Q5_K_M", 16, True) == "Q6_K"
    assert tensor_type("blk.5.ffn_down.weight", (2048, 8192), "Q5_K_M", 16, True) == "Q5_K"
    assert tensor_type("blk.0.attn_q.weight", (576, 576), "Q5_K_M", 30, True) == "Q5_1"
    # rows not a multiple of 256 (SmolLM2's 576): Q4_K falls back to Q5_0, Q6_K to Q8_0, as in llama.cpp
    assert tensor_type("blk.0.attn_q.weight", (576, 576), "Q4_K_M", 30, True) == "Q5_0"
    assert tensor_type("blk.0.attn_v.weight", (192, 576), "Q4_K_M", 30, True) == "Q8_0"
    assert tensor_type("blk.0.attn_q.weight", (576, 576), "Q4_K_M", 30, True, k_fallback="Q8_0") == "Q8_0"
    # Q4_0 / Q4_1 files: the output layer in Q6_K (Q8_0 where K is not a multiple of 256); a Q8_0 file keeps Q8_0
    assert tensor_type("output.weight", (128256, 2048), "Q4_0", 16, False) == "Q6_K"
    assert tensor_type("output.weight", (49152, 576), "Q4_1", 30, False) == "Q8_0"
    assert tensor_type("token_embd.weight", (49152, 576), "Q4_0", 30, False) == "Q4_0"
    assert tensor_type("output.weight", (128256, 2048), "Q8_0", 16, False) == "Q8_0"
    assert tensor_type("blk.0.ffn_up.weight", (100, 40), "Q4_0", 2, False) == "F16"  # 40 is no multiple of 32


def _tiny(model_type="llama", tied=False, vocab=300, seed=0):
    """A random tiny model: hidden 256, intermediate 512, 2 layers, 4 heads (of 64), 2 KV heads."""
    import transformers

    config_class = {"llama": "LlamaConfig", "qwen2": "Qwen2Config"}[model_type]
    config = getattr(transformers, config_class)(
        vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=tied, rms_norm_eps=1e-5)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()


def test_q4_k_m_model_loads_back_within_quantization_error(tmp_path):
    model = _tiny()
    path = tmp_path / "tiny-Q4_K_M.gguf"
    types = write_gguf_model(model, path, "Q4_K_M")
    reader = gguf.GGUFReader(str(path))
    assert {t.name: t.tensor_type.name for t in reader.tensors} == types
    assert reader.fields["general.file_type"].parts[-1][0] == gguf.LlamaFileType.MOSTLY_Q4_K_M
    assert types["output.weight"] == "Q6_K" and types["blk.1.attn_v.weight"] == "Q6_K"
    assert types["blk.0.attn_v.weight"] == "Q4_K" and types["blk.0.attn_norm.weight"] == "F32"
    loaded = _load(path).state_dict()
    for name, w in model.state_dict().items():
        err = (loaded[name] - w).abs().max().item()
        assert err <= (0 if w.dim() == 1 else 0.12 * w.abs().max().item()), name
    # the q/k rows come back in transformers' order: permuted rows would be off by about the weights themselves
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"):
        w = model.state_dict()[name]
        heads = 4 if "q_proj" in name else 2
        wrong = torch.from_numpy(permute(w.numpy(), heads))
        assert (loaded[name] - w).norm() < 0.15 * (loaded[name] - wrong).norm()


def test_f32_model_is_the_model_exactly(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    model = _tiny(tied=True)
    path = tmp_path / "tiny-F32.gguf"
    types = write_gguf_model(model, path, "F32")
    assert "output.weight" not in types and set(types.values()) == {"F32"}
    loaded = _load(path)
    assert loaded.config.tie_word_embeddings
    for name, w in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], w), name
    ids = torch.tensor([[1, 50, 299, 7]])
    assert torch.equal(loaded(ids).logits, model(ids).logits)
    # the made-up vocabulary: exactly the model's 300 tokens, byte-level, EOS last
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    config = AutoConfig.from_pretrained(str(tmp_path), gguf_file=path.name)
    assert len(tokenizer) == config.vocab_size == 300 and config.eos_token_id == 299
    assert tokenizer.decode(tokenizer("héllo, world").input_ids) == "héllo, world"


def test_qwen2_with_its_tokenizer_in_q8_0(tmp_path):
    """Qwen2 (q/k/v biases, no permutation) with a byte-level BPE tokenizer: the file's tokenizer encodes as the
    original does, and the weights come back within Q8_0's error."""
    from families import PROMPTS, VOCAB, bpe_tokenizer
    from transformers import AutoTokenizer

    model = _tiny("qwen2", vocab=VOCAB)
    path = tmp_path / "qwen2-Q8_0.gguf"
    types = write_gguf_model(model, path, "Q8_0", tokenizer=bpe_tokenizer())
    assert types["blk.0.attn_q.bias"] == "F32" and types["output.weight"] == "Q8_0"
    loaded = _load(path).state_dict()
    for name, w in model.state_dict().items():
        assert (loaded[name] - w).abs().max() <= 0.01 * w.abs().max(), name
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for prompt in PROMPTS:
        assert tokenizer(prompt).input_ids == bpe_tokenizer()(prompt).input_ids
