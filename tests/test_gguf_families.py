"""GGUF files of the families the fast paths run load onto them, as Llama's do (transformers reads the file; the
gguf package writes it here, with llama.cpp's tensor names)."""
import pytest
import torch

from families import _COMMON, bpe_tokenizer, prompt_ids
from gguf_writer import write_gguf
from specdec.config import GenerationConfig
from specdec.engine import SpecDecoder
from specdec.models.loading import load_model

# what transformers' GGUF reader reads back: Qwen3's head_dim and Gemma 2's query_pre_attn_scalar are not in its
# key mapping (it assumes 128 and 256, the released models' values), and Gemma's embeddings are tied
CONFIGS = {"qwen3": ("Qwen3Config", dict(head_dim=128)),
           "phi3": ("Phi3Config", dict(sliding_window=12)),
           "gemma2": ("Gemma2Config", dict(head_dim=32, query_pre_attn_scalar=256, tie_word_embeddings=True,
                                           sliding_window=12))}


@pytest.mark.parametrize("backend", ["kernels", "torch"])
@pytest.mark.parametrize("arch", list(CONFIGS))
def test_a_gguf_file_of_the_family_loads_onto_the_fast_path_with_its_weights(tmp_path, arch, backend):
    import transformers

    config_class, extra = CONFIGS[arch]
    config = getattr(transformers, config_class)(**{**_COMMON, **extra, "bos_token_id": 1, "eos_token_id": 2})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    path = write_gguf(model, bpe_tokenizer(), tmp_path / f"{arch}.gguf")
    if backend == "kernels":
        from specdec.kernels import unavailable_reason

        if unavailable_reason():
            pytest.skip(unavailable_reason())
    target = load_model(str(path), device="cpu", dtype="float32", backend=backend)
    assert type(target.backend).__name__ == {"kernels": "KernelLlama", "torch": "FastLlama"}[backend]
    loaded_weights = target.hf_model.state_dict()
    assert all(torch.equal(w, loaded_weights[name]) for name, w in model.state_dict().items())
    decoder = SpecDecoder(target, None)
    target.hf_model.generation_config.eos_token_id = None  # both run the full length, EOS or not
    for prompt in prompt_ids():
        got, _ = decoder.generate_ids(prompt, GenerationConfig(max_new_tokens=16, ignore_eos=True))
        want = target.hf_model.generate(torch.tensor([prompt]), max_new_tokens=16,
                                        do_sample=False)[0, len(prompt):].tolist()
        assert got == want
