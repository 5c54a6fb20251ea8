"""`specdec bench-shape --quant` (a shape written as a GGUF file, run in its formats on the CPU kernels) and
`--llama-cpp` (llama-bench on that file), on a tiny shape; llama-bench is a fake script: no test needs llama.cpp."""
import json
import stat
import sys

import pytest
import torch

from cli_runner import run_cli
from specdec.benchmarks.gguf_file import write_gguf_model
from specdec.benchmarks.llama_bench import SIGILL_LINE, parse, parse_request
from specdec.benchmarks.llamacpp import LlamaCppError
from specdec.benchmarks import shape_gguf
from specdec.benchmarks.shape_gguf import file_weights
from specdec.models.shapes import SHAPES, ModelShape, build_shape_model

pytest.importorskip("gguf")

# the smallest Llama whose matrices are whole Q4_K super-blocks (256) and whose made-up vocabulary fits (>= 259)
TINY = ModelShape("tiny-q", "(test)", "LlamaConfig", dict(
    hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=64, vocab_size=320, tie_word_embeddings=True, max_position_embeddings=512, initializer_range=0.02))
TINY_NEOX = ModelShape("tiny-neox", "(test)", "GPTNeoXConfig", dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=96,
    max_position_embeddings=256, initializer_range=0.3))
RUN = ("bench-shape", "--shape", "tiny-q", "--device", "cpu", "--prompt-tokens", "12", "--new-tokens", "8",
       "--pass-sizes", "1,4", "--repeats", "1")
FAKE_JSON = """[
  {
    "build_commit": "abc1234", "build_number": 7, "cpu_info": "fake CPU", "backends": "CPU", "n_threads": 2,
    "n_prompt": 0, "n_gen": 8, "n_depth": 12, "avg_ns": 160000000, "stddev_ns": 4000000,
    "avg_ts": 50.0, "stddev_ts": 1.25,
    "samples_ns": [ 163265306, 156862745 ],
    "samples_ts": [ 49.0, 51.0 ]
  },
  {
    "build_commit": "abc1234", "build_number": 7, "cpu_info": "fake CPU", "backends": "CPU", "n_threads": 2,
    "n_prompt": 12, "n_gen": 8, "n_depth": 0, "avg_ns": 400000000, "stddev_ns": 4000000,
    "avg_ts": 50.0, "stddev_ts": 0.5,
    "samples_ns": [ 380000000, 420000000 ],
    "samples_ts": [ 52.6, 47.6 ]
  }
]"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("specdec-cache")  # one cache: the tiny file is written once for the module


@pytest.fixture
def tiny(monkeypatch, cache):
    monkeypatch.setitem(SHAPES, TINY.name, TINY)
    monkeypatch.setitem(SHAPES, TINY_NEOX.name, TINY_NEOX)
    # the shape files alone go to the test's folder: SPECDEC_CACHE would move the built kernels too (a rebuild)
    monkeypatch.setattr(shape_gguf, "cache_root", lambda: cache)
    return cache


def error_line(err: str) -> str:
    """The error of a run whose progress lines (`bench-shape: ...`) came first: stderr's one other line."""
    lines = [line for line in err.strip().splitlines() if not line.startswith("bench-shape: ")]
    assert len(lines) == 1 and lines[0].startswith("specdec bench-shape: error: "), err
    return lines[0]


def fake_tool(folder, body: str):
    """An executable `llama-bench` shell script in `folder` running `body`."""
    folder.mkdir(exist_ok=True)
    path = folder / "llama-bench"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return folder


def test_quant_writes_a_file_that_runs_quantized_and_the_json_says_so(tmp_path, capsys, tiny):
    from specdec.models.loading import load_model

    out = tmp_path / "q.json"
    rc, stdout, err = run_cli(capsys, *RUN, "--quant", "Q4_0", "--out-json", str(out))
    assert rc == 0, err
    result = json.loads(out.read_text())
    assert result["settings"]["quant"] == "Q4_0" and result["settings"]["llama_cpp"] is None
    (entry,) = result["shapes"]
    path = tiny / "shapes" / "tiny-q-Q4_0-seed0.gguf"
    assert entry["gguf"]["path"] == str(path) and entry["gguf"]["file_bytes"] == path.stat().st_size
    assert not list(path.parent.glob(".*tmp*"))  # written under a temporary name, then renamed
    # the tied embedding is the output layer, which llama-quantize keeps in Q6_K
    assert entry["quant"] == "Q4_0" and entry["weight_types"] == ["Q4_0", "Q6_K"]
    assert entry["backend"] == "kernels" and entry["backend_class"] == "KernelLlama"
    model = build_shape_model("tiny-q", torch.device("cpu"), torch.float32)
    assert entry["parameters"] == sum(p.numel() for p in model.parameters())
    assert entry["gguf"]["tied_embedding"] and entry["bytes_read_per_token"] == entry["weight_bytes"]
    assert entry["weight_bytes"] == sum(entry["gguf"]["tensor_bytes_by_type"].values()) < path.stat().st_size
    assert entry["specdec_plain"]["tokens"] == 8 and entry["specdec_plain"]["tokens_per_s"] > 0
    assert entry["hf_generate"] is None and "cannot run" in entry["hf_generate_skipped"]
    assert entry["specdec_over_hf_generate"] is None and set(entry["pass_seconds"]) == {"1", "4"}
    assert 0 < entry["specdec_plain_share_of_bound"] == pytest.approx(
        entry["specdec_plain"]["tokens_per_s"] / entry["bandwidth_bound_tokens_per_s"])
    assert entry["bandwidth_bound_tokens_per_s"] == pytest.approx(
        result["memory_read_bandwidth_bytes_per_s"] / entry["bytes_read_per_token"])
    assert "llama_bench" not in entry and "tiny-q: Q4_0 file" in stdout and "Q4_0, Q6_K" in stdout
    memory = entry["memory"]  # what the load added to the process's resident set (Linux)
    if sys.platform.startswith("linux"):
        added = memory["resident_bytes_added_by_load"]
        assert isinstance(added, int) and memory["over_file_bytes"] == pytest.approx(added / path.stat().st_size)
        assert memory["max_context"] == 12 + 8 + 16 and "tiny-q: the load added" in stdout
        own, library = memory["own_bytes_added_by_load"], memory["library_bytes_added_by_load"]  # its two parts
        assert own + library == added and memory["own_over_file_bytes"] == pytest.approx(own / path.stat().st_size)
    loaded = load_model(str(path), device="cpu", max_context=64)
    assert loaded.backend.quantized_weights and loaded.backend.weight_types == ["Q4_0", "Q6_K"]

    before = path.stat().st_mtime_ns
    rc, _, err = run_cli(capsys, *RUN, "--quant", "Q4_0", "--out-json", str(out))
    assert rc == 0, err
    assert json.loads(out.read_text())["shapes"][0]["gguf"]["written_now"] is False
    assert path.stat().st_mtime_ns == before  # the same name: reused, not written again


def test_bytes_read_per_step_leave_out_an_untied_embedding_but_a_row(tmp_path, monkeypatch):
    untied = ModelShape("tiny-q-untied", "(test)", "LlamaConfig", {**TINY.values, "tie_word_embeddings": False})
    monkeypatch.setitem(SHAPES, untied.name, untied)
    path = tmp_path / "untied.gguf"
    types = write_gguf_model(build_shape_model(untied.name, torch.device("cpu"), torch.float32), path, "Q8_0")
    assert types["token_embd.weight"] == "Q8_0" and types["output.weight"] == "Q8_0"
    weights = file_weights(path)
    row = 256 // 32 * 34  # a Q8_0 row of 256: 8 blocks of 32 int8 and a float16 scale
    assert not weights.tied and weights.bytes_read_per_token == weights.tensor_bytes - 320 * row + row


def test_llama_bench_runs_on_the_same_file_and_the_ratio_is_specdecs_over_its(tmp_path, capsys, tiny):
    folder = fake_tool(tmp_path / "bin", f'echo "$@" >> "$(dirname "$0")/args.txt"\necho "loading" >&2\n'
                                         f"cat <<'JSON'\n{FAKE_JSON}\nJSON")
    out = tmp_path / "q.json"
    rc, stdout, err = run_cli(capsys, *RUN, "--quant", "Q4_0", "--llama-cpp", str(folder), "--out-json", str(out))
    assert rc == 0, err
    entry = json.loads(out.read_text())["shapes"][0]
    decoding, request = (line.split() for line in (folder / "args.txt").read_text().splitlines())
    common = ["-t", str(torch.get_num_threads()), "-r", "1", "-o", "json"]
    assert decoding == ["-m", entry["gguf"]["path"], "-p", "0", "-n", "8", "-d", "12", *common]
    assert request == ["-m", entry["gguf"]["path"], "-p", "0", "-n", "0", "-pg", "12,8", "-d", "0", *common]
    args = decoding
    lb = entry["llama_bench"]
    assert lb["request"]["seconds"] == pytest.approx(0.4) and lb["request"]["new_tokens_per_s"] == pytest.approx(20.0)
    assert lb["request"]["samples_seconds"] == pytest.approx([0.38, 0.42]) and lb["request"]["command"][1:] == request
    assert entry["specdec_request_over_llama_bench_request"] == pytest.approx(entry["specdec_plain"]["tokens_per_s"] / 20)
    assert "a request (12-token prompt, 8 new tokens), llama-bench pg: 20.0 new tok/s" in stdout
    assert lb["tokens_per_s"] == 50.0 and lb["samples_tokens_per_s"] == [49.0, 51.0] and lb["build_commit"] == "abc1234"
    assert lb["command"][1:] == args and lb["n_depth"] == 12
    plain = entry["specdec_plain"]
    assert entry["specdec_plain_over_llama_bench"] == pytest.approx(plain["tokens_per_s"] / 50.0)
    assert entry["specdec_decode_over_llama_bench"] == pytest.approx(plain["decode_tokens_per_s"] / 50.0)
    assert entry["llama_bench_share_of_bound"] == pytest.approx(50.0 / entry["bandwidth_bound_tokens_per_s"])
    assert "llama-bench tg8 @ d12: 50.0 tok/s (runs 49.0, 51.0)" in stdout and "build abc1234" in stdout


@pytest.mark.parametrize("body", ["kill -ILL $$", "exit 132"])
def test_llama_bench_dying_of_sigill_is_one_line_naming_the_build(tmp_path, capsys, tiny, body):
    folder = fake_tool(tmp_path / "bin", body)
    rc, _, err = run_cli(capsys, *RUN, "--quant", "Q4_0", "--llama-cpp", str(folder))
    line = error_line(err)
    assert rc == 2 and SIGILL_LINE in line and "-DGGML_NATIVE=OFF" in line and "docs/llamacpp.md" in line


def test_another_llama_bench_failure_is_its_last_stderr_line(tmp_path, capsys, tiny):
    folder = fake_tool(tmp_path / "bin", 'echo "llama_model_load: starting" >&2\n'
                                         'echo "error: failed to load model" >&2\nexit 1')
    rc, _, err = run_cli(capsys, *RUN, "--quant", "Q4_0", "--llama-cpp", str(folder))
    assert rc == 2 and error_line(err).endswith("llama-bench exited with 1: error: failed to load model"), err


@pytest.mark.parametrize("args, message", [
    (["--llama-cpp", "/nowhere"], "--llama-cpp runs llama-bench on the shape's GGUF file: it needs --quant"),
    (["--quant", "Q4_0", "--llama-cpp", "/nowhere"], "/nowhere/llama-bench not found"),
    (["--quant", "Q4_0", "--dtype", "bfloat16"], "--dtype bfloat16 does not apply"),
    (["--quant", "Q4_0", "--backend", "torch"], "--quant runs on the kernels backend, not torch"),
    (["--quant", "Q5_0"], "argument --quant: invalid choice: 'Q5_0'"),
])
def test_bad_quant_input_is_one_line(capsys, tiny, args, message):
    rc, _, err = run_cli(capsys, *RUN, *args)
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_family_the_writer_does_not_take_is_refused_in_one_line(capsys, tiny):
    rc, _, err = run_cli(capsys, "bench-shape", "--shape", "tiny-neox", "--device", "cpu", "--quant", "Q4_0")
    assert rc == 2 and "tiny-neox shape (gpt_neox) cannot be written as a GGUF file" in err, err


def test_parse_reads_the_tg_test_and_refuses_other_output():
    assert parse(FAKE_JSON, 8)["stddev_tokens_per_s"] == 1.25
    for text, message in (("| model | size |", "printed no JSON"), (FAKE_JSON, "no test of 16 generated tokens")):
        with pytest.raises(LlamaCppError, match=message):
            parse(text, 16)


def test_parse_request_reads_the_pg_test_by_its_new_tokens_over_its_seconds():
    assert parse_request(FAKE_JSON, 12, 8)["new_tokens_per_s"] == pytest.approx(8 / 0.4)  # not its avg_ts of 50
    with pytest.raises(LlamaCppError, match="no test of a prompt of 64 and 8 generated tokens"):
        parse_request(FAKE_JSON, 64, 8)
