"""Named model shapes with random weights, and `specdec bench-shape` end to end on tiny shapes on the CPU."""
import json

import pytest
import torch

from cli_runner import run_cli
from specdec.models import shapes
from specdec.models.shapes import SHAPES, ModelShape, build_shape_model, count_parameters, shape_config

# Parameters of each public checkpoint (tied embeddings once), as their model cards and keras-hub's presets give them
PUBLISHED_PARAMETERS = {
    "smollm2-135m": 134_515_008,
    "llama-3.2-1b": 1_235_814_400,
    "qwen2.5-0.5b": 494_032_768,
    "qwen3-0.6b": 596_049_920,
    "gemma-3-1b": 999_885_952,
    "llama-3.1-8b": 8_030_261_248,
}

TINY_LLAMA = ModelShape("tiny-llama", "(test)", "LlamaConfig", dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=128, tie_word_embeddings=True, max_position_embeddings=512, initializer_range=0.3))
TINY_NEOX = ModelShape("tiny-neox", "(test)", "GPTNeoXConfig", dict(  # a family no fast path takes
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=96,
    max_position_embeddings=256, initializer_range=0.3))


@pytest.fixture
def tiny_shapes(monkeypatch):
    for shape in (TINY_LLAMA, TINY_NEOX):
        monkeypatch.setitem(SHAPES, shape.name, shape)


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMETERS))
def test_each_shape_has_its_checkpoints_parameter_count(name):
    assert count_parameters(name) == PUBLISHED_PARAMETERS[name]  # on the meta device: nothing allocated


def test_every_shape_is_counted():
    assert set(SHAPES) == set(PUBLISHED_PARAMETERS)


def test_shapes_are_their_families_configs():
    qwen3, gemma, llama = shape_config("qwen3-0.6b"), shape_config("gemma-3-1b"), shape_config("llama-3.2-1b")
    assert (type(qwen3).__name__, qwen3.model_type, qwen3.head_dim) == ("Qwen3Config", "qwen3", 128)
    assert type(gemma).__name__ == "Gemma3TextConfig" and gemma.sliding_window == 512
    assert gemma.layer_types[5] == "full_attention" and gemma.layer_types.count("full_attention") == 4
    assert {k: v["rope_theta"] for k, v in gemma.rope_parameters.items()} == {"sliding_attention": 10000.0,
                                                                             "full_attention": 1000000.0}
    assert llama.rope_parameters["rope_type"] == "llama3" and llama.tie_word_embeddings
    assert not shape_config("llama-3.1-8b").tie_word_embeddings
    assert all(shape_config(name).eos_token_id is None for name in SHAPES)  # runs make every token asked for


def test_weights_are_seeded_and_built_in_the_asked_dtype(tiny_shapes):
    first = build_shape_model("tiny-llama", torch.device("cpu"), torch.bfloat16, seed=3)
    again = build_shape_model("tiny-llama", torch.device("cpu"), torch.bfloat16, seed=3)
    other = build_shape_model("tiny-llama", torch.device("cpu"), torch.bfloat16, seed=4)
    weights = [dict(m.named_parameters()) for m in (first, again, other)]
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in weights[0].values())
    assert all(torch.equal(p, weights[1][k]) for k, p in weights[0].items())
    assert not torch.equal(weights[0]["model.layers.0.mlp.up_proj.weight"],
                           weights[2]["model.layers.0.mlp.up_proj.weight"])


def test_bytes_read_per_token_leave_out_an_untied_input_embedding(monkeypatch):
    untied = ModelShape("tiny-untied", "(test)", "LlamaConfig", {**TINY_LLAMA.values, "tie_word_embeddings": False})
    monkeypatch.setitem(SHAPES, untied.name, untied)
    model = build_shape_model(untied.name, torch.device("cpu"), torch.float32)
    embed = model.get_input_embeddings().weight
    assert shapes.bytes_read_per_token(model) == shapes.weight_bytes(model) - (embed.numel() - 64) * 4


def test_bench_shape_end_to_end(tmp_path, capsys, tiny_shapes):
    out = tmp_path / "shapes.json"
    rc, stdout, err = run_cli(capsys, "bench-shape", "--shape", "tiny-llama,tiny-neox", "--device", "cpu",
                              "--dtype", "float32", "--prompt-tokens", "12", "--new-tokens", "8", "--pass-sizes",
                              "1,4", "--repeats", "1", "--out-json", str(out))
    assert rc == 0, err
    result = json.loads(out.read_text())
    assert result["speed_only"] is True and "no acceptance" in result["note"]
    assert result["torch"] == torch.__version__ and result["date"] and "cpu_features" in result["machine"]
    assert result["memory_read_bandwidth_bytes_per_s"] > 0 and result["gpu"] is None
    llama, neox = result["shapes"]
    for entry in (llama, neox):
        assert entry["specdec_plain"]["tokens_per_s"] > 0 and entry["hf_generate"]["tokens_per_s"] > 0
        assert entry["specdec_plain"]["tokens"] == 8 and set(entry["pass_seconds"]) == {"1", "4"}
        assert all(s > 0 for s in entry["pass_seconds"].values())
        assert entry["weight_bytes"] == entry["parameters"] * 4
        assert 0 < entry["specdec_plain_share_of_bound"] == pytest.approx(
            entry["specdec_plain"]["tokens_per_s"] / entry["bandwidth_bound_tokens_per_s"])
        assert entry["specdec_plain"]["decode_tokens_per_s"] > 0 and entry["specdec_decode_share_of_bound"] > 0
        # one run: its decoding against the bandwidth read just before it, besides the bound read at the start
        plain, per_token = entry["specdec_plain"], entry["bytes_read_per_token"]
        (before,) = plain["read_bandwidth_before_run"]
        assert before > 0 and plain["decode_tokens_per_s_by_run"] == [plain["decode_tokens_per_s"]]
        assert entry["specdec_decode_share_of_bound_paired"] == pytest.approx(
            plain["decode_tokens_per_s"] * per_token / before)
        assert f"{entry['shape']}: decode share of the bandwidth read just before each run" in stdout
        assert entry["same_tokens_as_hf_generate"] is True  # float32, greedy: specdec's plain decoding is generate's
        assert not any(k in entry for k in ("mean_accepted_tokens", "acceptance_rate"))
    assert llama["backend"] in ("kernels", "torch") and llama["fast_path_problem"] is None
    assert neox["backend"] == "hf" and "gpt_neox" in neox["fast_path_problem"]
    assert f"tiny-neox: transformers' forward (hf): {neox['fast_path_problem']}" in stdout


@pytest.mark.parametrize("args, message", [
    (["--shape", "llama-9b"], "unknown shape 'llama-9b'"),
    (["--shape", "tiny-llama", "--pass-sizes", "1,0"], "--pass-sizes takes whole numbers >= 1"),
    (["--shape", "tiny-llama", "--pass-sizes", "1,x"], "--pass-sizes takes comma-separated whole numbers"),
    (["--shape", "tiny-llama", "--new-tokens", "0"], "--new-tokens must be >= 1"),
    (["--shape", "tiny-neox", "--backend", "torch", "--device", "cpu"], "the torch backend does not support"),
    (["--shape", "tiny-llama", "--turbo"], "unrecognized arguments: --turbo"),
])
def test_bad_input_is_one_line_and_a_nonzero_exit(capsys, tiny_shapes, args, message):
    rc, _, err = run_cli(capsys, "bench-shape", "--new-tokens", "4", "--pass-sizes", "1", "--repeats", "1", *args)
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err
