"""Native llama.cpp in `specdec bench`: its output parsed from recorded samples of the real tools (llama.cpp from
the llama-cpp-python 0.3.36 sdist, commit 0c1e570, on smollm2-135m's Q4_1 GGUF), the refusals, and one real run
when SPECDEC_LLAMA_CPP names a folder of built tools."""
import json
import os

import pytest

from specdec.benchmarks.llamacpp import (LlamaCppError, completion_text, lookup_metrics, lookup_text, parse_lookup,
                                    parse_perf, until_eos)
from specdec.cli.main import main

PROMPT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
          "<|im_start|>user\nRepeat exactly: the cat sat on the mat, the cat sat on the mat.<|im_end|>\n"
          "<|im_start|>assistant\n")

# llama-completion -t 2 --temp 0 -n 32 -no-cnv --no-display-prompt -sp --simple-io (stdout; then the end of stderr)
COMPLETION_STDOUT = ("Hello there, welcome to my world! I'm here to help with any kind of creative writing project. "
                     "What can I help you with today?<|im_end|> [end of text]\n\n\n")
COMPLETION_STDERR = """\
0.00.897.039 I generate: n_ctx = 8192, n_batch = 2048, n_predict = 32, n_keep = 0
0.00.897.057 I 
0.02.233.470 I common_perf_print:    sampling time =       2.97 ms
0.02.233.495 I common_perf_print:    samplers time =       1.16 ms /    63 tokens
0.02.233.518 I common_perf_print:        load time =     502.45 ms
0.02.233.539 I common_perf_print: prompt eval time =     473.88 ms /    33 tokens (   14.36 ms per token,    69.64 tokens per second)
0.02.233.559 I common_perf_print:        eval time =     855.02 ms /    29 runs   (   29.48 ms per token,    33.92 tokens per second)
0.02.233.578 I common_perf_print:       total time =    1337.15 ms /    62 tokens
0.02.233.598 I common_perf_print: unaccounted time =       5.29 ms /   0.4 %      (total - sampling - prompt eval - eval) / (total)
0.02.233.617 I common_perf_print:    graphs reused =         28
"""  # noqa: W291

# llama-lookup -t 2 --temp 0 -p PROMPT -n 40 --spec-draft-n-max 8: it goes on past <|im_end|> within a step
LOOKUP_STDOUT = "\n\n" + PROMPT + "The cat sat on the mat.<|im_end|>\n<|im_end|>\n\n\n\n"
LOOKUP_STDERR = """\
0.00.739.060 I cmn          init: llama threadpool init, n_threads = 2
0.01.509.014 I encoded   47 tokens in    0.601 seconds, speed:   94.886 t/s
0.01.509.015 I decoded   10 tokens in    0.120 seconds, speed:   83.010 t/s
0.01.509.015 I 
0.01.509.016 I n_draft      = 8
0.01.509.016 I n_predict    = 10
0.01.509.016 I n_drafted    = 8
0.01.509.016 I t_draft_flat = 0.04 ms
0.01.509.018 I t_draft      = 0.04 ms, 5.12 us per token, 195121.95 tokens per second
0.01.509.018 I n_accept     = 7
0.01.509.018 I accept       = 87.500%
0.01.509.019 I 
target:

0.01.509.020 I common_perf_print:    sampling time =       1.19 ms
0.01.509.022 I common_perf_print:        load time =     464.64 ms
0.01.509.023 I common_perf_print: prompt eval time =     600.75 ms /    56 tokens (   10.73 ms per token,    93.22 tokens per second)
0.01.509.024 I common_perf_print:        eval time =      31.45 ms /     1 runs   (   31.45 ms per token,    31.80 tokens per second)
0.01.509.026 I common_perf_print: unaccounted time =      88.45 ms /  12.3 %      (total - sampling - prompt eval - eval) / (total)
"""  # noqa: W291


def test_completion_perf_and_text():
    perf = parse_perf(COMPLETION_STDERR)
    assert perf.prompt_eval_tokens == 33 and perf.eval_runs == 29
    assert perf.prompt_eval_s == pytest.approx(0.47388) and perf.eval_s == pytest.approx(0.85502)
    assert perf.sampling_s == pytest.approx(0.00297)
    assert completion_text(COMPLETION_STDOUT).endswith("with today?<|im_end|>")  # EOS kept, tool's note gone
    assert completion_text("a\n\n\n") == "a\n"  # a length stop: only the closing blank line goes


def test_lookup_stats_text_and_metrics():
    stats = parse_lookup(LOOKUP_STDERR)
    assert (stats.encoded, stats.n_predict, stats.n_drafted, stats.n_accept) == (47, 10, 8, 7)
    assert stats.encode_s == pytest.approx(0.601) and stats.decode_s == pytest.approx(0.120)
    assert stats.draft_s == pytest.approx(0.00008)
    assert lookup_text(LOOKUP_STDOUT, PROMPT) == "The cat sat on the mat.<|im_end|>\n<|im_end|>"
    with pytest.raises(LlamaCppError, match="did not echo the prompt"):
        lookup_text(LOOKUP_STDOUT, "<|im_start|>" + PROMPT)  # e.g. a BOS it added
    # 10 tokens in 3 rounds of sampling: the prompt's pass, then 2 verify steps (7 drafts accepted in one)
    m = lookup_metrics(stats, kept=8, prompt_tokens=47, seconds=0.721)
    assert (m.steps, m.step_tokens, m.new_tokens) == (2, 9, 8)
    assert m.mean_accepted_tokens == 4.5 and m.acceptance_rate == 7 / 8 and m.mean_acceptance_length is None
    assert until_eos([5, 6, 2, 7, 2], {2}) == [5, 6, 2] and until_eos([5, 6], {2}) == [5, 6]


def test_missing_values_are_errors():
    with pytest.raises(LlamaCppError, match="no prompt eval time"):
        parse_perf("main: done\n")
    with pytest.raises(LlamaCppError, match="no encoded token count"):
        parse_lookup(COMPLETION_STDERR)


def test_missing_tool_and_unknown_model_are_one_line_errors(tmp_path, capsys, tiny_folder):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "c", "turns": ["hi"]}))
    rc = main(["bench", "--prompts", str(prompts), "--llama-cpp", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert str(tmp_path / "llama-completion") in err and "not found" in err
    for binary in ("llama-completion", "llama-lookup"):
        (tmp_path / binary).write_text("")
    rc = main(["bench", "--prompts", str(prompts), "--model", str(tiny_folder), "--llama-cpp", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "built-in model" in err


@pytest.mark.skipif(not os.environ.get("SPECDEC_LLAMA_CPP"), reason="SPECDEC_LLAMA_CPP: a folder of built llama.cpp tools")
def test_real_llama_cpp_in_bench(tmp_path):
    """Both tools on two prompts of smollm2-135m (fetched if not cached), beside specdec's plain decoding."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"question_id": i, "category": "c", "turns": [t]}) for i, t in enumerate(
        ["Repeat exactly: the cat sat on the mat, the cat sat on the mat.", "Name three colours."])))
    out = tmp_path / "b.json"
    rc = main(["bench", "--prompts", str(prompts), "--max-new-tokens", "16", "--dtype", "float32", "--drafters",
               "ngram", "--no-hf", "--llama-cpp", os.environ["SPECDEC_LLAMA_CPP"], "--out-json", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["llama_cpp"]["version"] and result["llama_cpp"]["gguf"].endswith(".gguf")
    plain, lookup = result["methods"]["llamacpp"], result["methods"]["llamacpp_lookup"]
    for m in (plain, lookup):
        assert m["tokens_per_s"] > 0 and 0 < m["tokens"] <= 2 * 16
    assert plain["mean_accepted_tokens"] is None and lookup["mean_accepted_tokens"] >= 1.0
    assert lookup["identical_to_specdec_none"] is not None  # against llamacpp, its own plain decoding
