"""The command line: generation on a local model folder, and one-line errors for bad input."""
import json
import subprocess
import sys

import pytest
import torch

from cli_runner import run_cli


def test_generate_streams_text_and_stats(capsys, tiny_folder):
    rc, out, err = run_cli(capsys, "generate", "the cat sat", "--model", str(tiny_folder), "--dtype", "float32",
                           "--max-new-tokens", "12", "--drafter", "ngram", "--stats-json")
    assert rc == 0
    assert out.strip(), "no text on stdout"
    stats = json.loads(err.strip().splitlines()[-1])
    assert stats["new_tokens"] >= 1 and stats["prompt_tokens"] > 0


def test_generate_with_penalties(capsys, tiny_folder):
    common = ["generate", "the cat sat", "--model", str(tiny_folder), "--dtype", "float32", "--max-new-tokens", "12"]
    rc, plain, _ = run_cli(capsys, *common)
    rc2, penalized, _ = run_cli(capsys, *common, "--repetition-penalty", "1.5", "--frequency-penalty", "1",
                                "--presence-penalty", "0.5", "--logit-bias", "7=-100")
    assert rc == rc2 == 0 and penalized.strip() and penalized != plain


def test_generate_prints_logprobs(capsys, tiny_folder):
    rc, out, err = run_cli(capsys, "generate", "the cat sat", "--model", str(tiny_folder), "--dtype", "float32",
                           "--max-new-tokens", "6", "--drafter", "ngram", "--logprobs", "2", "--stats-json")
    lines = [json.loads(line) for line in err.strip().splitlines() if line.startswith("{")]
    rows, stats = lines[:-1], lines[-1]
    assert rc == 0 and out.strip() and len(rows) == stats["new_tokens"] > 0
    assert all(len(r["top"]) == 2 and r["top"][0][2] >= r["top"][1][2] and r["logprob"] <= 0 for r in rows)


@pytest.mark.parametrize("draft", ["tiny_draft_folder", "other_vocab_folder"])  # the same tokenizer, another one
def test_generate_with_draft_model(capsys, request, tiny_folder, draft):
    common = ["generate", "the dog ran", "--model", str(tiny_folder), "--dtype", "float32", "--max-new-tokens", "8"]
    rc, out, err = run_cli(capsys, *common, "--drafter", "draft-model", "--draft-model",
                           str(request.getfixturevalue(draft)), "--stats")
    assert rc == 0 and "drafter draft-model" in err
    assert out == run_cli(capsys, *common, "--drafter", "none")[1]


def test_draft_p_min_reaches_the_draft_model(capsys, tiny_folder, tiny_draft_folder):
    """Near 1, every drafting step drafts one token (of -k 4), and the text is plain decoding's."""
    common = ["generate", "the dog ran", "--model", str(tiny_folder), "--dtype", "float32", "--max-new-tokens", "8"]
    rc, out, err = run_cli(capsys, *common, "--drafter", "draft-model", "--draft-model", str(tiny_draft_folder),
                           "--no-adaptive", "-k", "4", "--draft-p-min", "0.999", "--stats-json")
    stats = json.loads(err.strip().splitlines()[-1])
    assert rc == 0 and stats["drafted_tokens"] == stats["drafting_steps"] > 0
    assert out == run_cli(capsys, *common, "--drafter", "none")[1]


def test_serve_hands_every_drafter_option_to_its_drafters():
    """Heads, tree shape and the rest reach the server's drafters (the draft model is loaded apart)."""
    from specdec.cli.main import build_parser
    from specdec.cli.serve import served_drafter_options

    args = build_parser().parse_args(["serve", "--eagle-head", "h", "--medusa-head", "m", "--chain", "--tree-width",
                                      "4", "--tree-nodes", "20", "--layerskip-layers", "3", "--select-from", "ngram"])
    options = served_drafter_options(args)
    assert {k: options[k] for k in ("eagle_head", "medusa_head", "tree", "tree_width", "tree_nodes",
                                    "layerskip_layers", "select_from")} == {
        "eagle_head": "h", "medusa_head": "m", "tree": False, "tree_width": 4, "tree_nodes": 20,
        "layerskip_layers": 3, "select_from": "ngram"}
    assert "draft_model" not in options


def test_models_lists_the_default(capsys):
    rc, out, _ = run_cli(capsys, "models", "--json")
    assert rc == 0 and any(row["name"] == "smollm2-135m" for row in json.loads(out))


@pytest.mark.parametrize("argv,message", [
    (["generate", "hi", "--model", "no-such-model"], "unknown model"),
    (["generate", "hi", "--model", "/nonexistent/model.gguf"], "GGUF file not found"),
    (["generate", "hi", "--temperature", "-1"], "temperature"),
    (["generate", "hi", "--top-p", "0"], "top_p"),
    (["generate", "hi", "--top-k", "-3"], "top_k"),
    (["generate", "hi", "--max-new-tokens", "0"], "max_new_tokens"),
    (["generate", "hi", "--repetition-penalty", "0"], "repetition_penalty"),
    (["generate", "hi", "--presence-penalty", "3"], "presence_penalty"),
    (["generate", "hi", "--min-p", "2"], "min_p"),
    (["generate", "hi", "--logit-bias", "the=5"], "TOKEN_ID=BIAS"),
    (["generate", "hi", "--model", "{tiny}", "--logit-bias", "99999=5"], "outside the vocabulary"),
    (["generate", "hi", "--temperature", "warm"], "invalid float"),
    (["generate", "hi", "--dtype", "int3"], "invalid choice"),
    (["generate", "hi", "--drafter", "telepathy", "--model", "{tiny}"], "unknown drafter"),
    (["generate", "hi", "--drafter", "draft-model", "--model", "{tiny}"], "needs a draft model"),
    (["generate", "hi", "--drafter", "select", "--select-from", "ngram,telepathy", "--model", "{tiny}"],
     "--select-from takes drafter names"),
    (["generate", "hi", "--drafter", "medusa", "--model", "{tiny}"], "train-drafter --kind medusa"),
    (["generate", "hi", "--drafter", "medusa", "--model", "{tiny}", "--medusa-head", "/nonexistent"],
     "holds no Medusa heads"),
    (["generate", "   ", "--model", "{tiny}"], "prompt is empty"),
    (["generate", "hi", "-k", "500"], "num_speculative_tokens"),
    (["generate", "hi", "--draft-p-min", "1"], "argument --draft-p-min: draft_p_min must be in [0, 1), got 1.0"),
    (["generate", "hi", "--draft-p-min", "high"], "invalid draft_p_min value"),
    (["serve", "--draft-p-min", "-0.5"], "draft_p_min must be in [0, 1), got -0.5"),
    (["bench", "--prompts", "p.jsonl", "--draft-p-min", "2"], "draft_p_min must be in [0, 1), got 2.0"),
    (["generate", "hi", "--tree-nodes", "0"], "--tree-nodes must be >= 1, got 0"),
    (["bench", "--prompts", "p.jsonl", "--tree-width", "0"], "--tree-width must be >= 1, got 0"),
    (["generate", "hi", "--logprobs", "21"], "logprobs"),
    (["generate", "hi", "--regex", "[a-"], "invalid regex"),
    (["generate", "hi", "--json-schema", "{oops"], "not valid JSON"),
    (["generate", "hi", "--json-schema", "@/nonexistent.json"], "cannot read"),
    (["bench", "--prompts", "/nonexistent.jsonl"], "prompt file not found"),
    (["generate", "hi", "--model", "{tiny}", "--trace", "/proc/specdec/trace.jsonl"], "cannot write the trace file"),
    (["serve", "--speculation-max-batch", "0"], "--speculation-max-batch must be >= 1, got 0"),
    (["serve", "--speculation-max-batch", "many"], "invalid int value"),
    (["serve", "--prefill-chunk", "0"], "prefill chunk must be 'auto', 'off' or a number of tokens >= 1, got '0'"),
    (["bench-serve", "--prefill-chunk", "lots"], "prefill chunk must be"),
    (["bench-serve", "--long-prompts", "-1"], "--long-prompts takes a count >= 0"),
    (["train-drafter", "--out", "/tmp/specdec-never", "--synthesize", "-1"], "must be >= 0"),
    (["train-drafter", "--out", "/tmp/specdec-never", "--data", "/nonexistent.jsonl"], "file not found"),
    (["train-drafter", "--out", "/tmp/specdec-never", "--data", "/nonexistent.jsonl:0"], "weight must be a positive"),
    (["train-drafter", "--out", "/tmp/specdec-never", "--labels", "fuzzy"], "invalid choice"),
    (["train-drafter", "--out", "/tmp/specdec-never", "--document-tasks", "-2"], "must be >= 0"),
    (["train-drafter", "--out", "/tmp/specdec-never", "--kind", "medusa", "--medusa-num-heads", "0"], "must be >= 1"),
    (["train-drafter", "--out", "/tmp/specdec-never", "--model", "{tiny}", "--dtype", "float32", "--max-prompts", "0"],
     "--max-prompts 0 needs --synthesize N"),
    (["train-drafter", "--out", "/tmp/specdec-never", "--model", "{tiny}", "--dtype", "float32", "--feature-layers",
      "0,1"], "--feature-layers is for --kind eagle3"),
    (["train-drafter", "--out", "/tmp/specdec-never", "--model", "{tiny}", "--dtype", "float32", "--kind", "eagle3",
      "--feature-layers", "0,2"], "distinct layers from 0 to 1"),
    (["train-drafter", "--out", "/tmp/specdec-never", "--model", "{tiny}", "--dtype", "float32", "--kind", "eagle3",
      "--feature-layers", "low"], "layer numbers separated by commas"),
])
def test_bad_input_gives_one_line_and_nonzero_exit(capsys, tiny_folder, other_vocab_folder, argv, message):
    argv = [a.replace("{tiny}", str(tiny_folder)).replace("{other}", str(other_vocab_folder)) for a in argv]
    rc, out, err = run_cli(capsys, *argv, *(["--dtype", "float32"] if "--dtype" not in argv and argv[0] == "generate" else []))
    assert rc == 2
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert message in lines[0]
    assert "Traceback" not in err


def test_errors_have_no_traceback_in_a_real_process(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "specdec.cli.main", "generate", "hi", "--model", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "not a model folder" in proc.stderr


def test_train_drafter_end_to_end_with_synthetic_prompts_and_a_warm_start(capsys, tiny_folder, tmp_path):
    from specdec.drafters.heads.eagle_loading import load_head
    from specdec.models.loading import load_model

    prompts = tmp_path / "prompts.jsonl"
    rows = [{"source": "a", "prompt": "the cat sat on the mat"}, {"source": "a", "prompt": "a big red dog ran"},
            {"source": "b", "prompt": "she was in the tree again"}]
    prompts.write_text("\n".join(json.dumps(r) for r in rows))
    common = ["train-drafter", "--model", str(tiny_folder), "--dtype", "float32", "--prompts", str(prompts),
              "--max-new-tokens", "8", "--time-budget", "0.01", "--draft-vocab", "16"]
    rc, _, err = run_cli(capsys, *common, "--out", str(tmp_path / "h1"), "--data-dir", str(tmp_path / "d1"),
                         "--max-prompts", "2", "--synthesize", "6", "--temperature", "0.8")
    assert rc == 0, err
    first = json.loads((tmp_path / "h1" / "training_record.json").read_text())
    synthetic = (tmp_path / "d1-synth6" / "synthetic_prompts.jsonl").read_text().splitlines()
    assert len(synthetic) == 6 and first["answer_temperature"] == 0.8
    assert 2 < first["data_sequences"] <= 8
    rc, _, err = run_cli(capsys, *common, "--out", str(tmp_path / "h2"), "--data-dir", str(tmp_path / "d2"),
                         "--max-prompts", "3", "--extra-data", str(tmp_path / "d1"),
                         "--init-from", str(tmp_path / "h1"), "--document-tasks", "4")
    assert rc == 0, err
    second = json.loads((tmp_path / "h2" / "training_record.json").read_text())
    # its own 3 prompts, d1's 2 (not d1's synthetic ones, kept in their own folder) and 4 document tasks
    assert second["data_sequences"] == 3 + 2 + 4 and second["init_from"] == str(tmp_path / "h1")
    documents = json.loads((tmp_path / "d2-doc4" / "index.json").read_text())
    assert documents["done"] == 4 and documents["documents_from"] == [str(tmp_path / "d2"), str(tmp_path / "d1")]
    assert load_head(tmp_path / "h2", load_model(str(tiny_folder), dtype="float32")).config.draft_vocab_size == 16
    # synthetic prompts only: d1's two records are left out, its six synthetic prompts (cached) are used
    rc, _, err = run_cli(capsys, *common, "--out", str(tmp_path / "h3"), "--data-dir", str(tmp_path / "d1"),
                         "--max-prompts", "0", "--synthesize", "6", "--temperature", "0.8")
    assert rc == 0, err
    third = json.loads((tmp_path / "h3" / "training_record.json").read_text())
    assert third["records_used"] == 0 and third["data_sequences"] == first["data_sequences"] - 2


def test_train_medusa_heads_then_generate_with_them(capsys, tiny_folder, tmp_path):
    from specdec.drafters.heads.medusa_head import load_medusa_heads
    from specdec.models.loading import load_model

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"source": "a", "prompt": p})
                                 for p in ("the cat sat on the mat", "a big red dog ran", "she was in the tree")))
    rc, out, err = run_cli(capsys, "train-drafter", "--kind", "medusa", "--medusa-num-heads", "3", "--model",
                           str(tiny_folder), "--dtype", "float32", "--prompts", str(prompts), "--max-new-tokens", "8",
                           "--time-budget", "0.01", "--draft-vocab", "16", "--out", str(tmp_path / "m"),
                           "--data-dir", str(tmp_path / "d"))
    assert rc == 0, err
    record = json.loads((tmp_path / "m" / "training_record.json").read_text())
    assert record["kind"] == "medusa" and set(record["heldout"]) == {"acc1", "acc2", "acc3", "chain_mat"}
    heads = load_medusa_heads(tmp_path / "m", load_model(str(tiny_folder), dtype="float32"))
    assert heads.config.num_heads == 3 and heads.config.draft_vocab_size == 16
    common = ["generate", "the cat sat", "--model", str(tiny_folder), "--dtype", "float32", "--max-new-tokens", "12"]
    rc, plain, _ = run_cli(capsys, *common, "--drafter", "none")
    rc2, drafted, err = run_cli(capsys, *common, "--drafter", "medusa", "--medusa-head", str(tmp_path / "m"))
    assert rc == rc2 == 0 and drafted == plain, err


def test_train_an_eagle3_head_then_warm_start_one_and_generate_with_it(capsys, tiny_folder, tmp_path):
    from specdec.drafters.heads.eagle3_loading import load_eagle3_head
    from specdec.models.loading import load_model

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"source": "a", "prompt": p})
                                 for p in ("the cat sat on the mat", "a big red dog ran", "she was in the tree")))
    common = ["train-drafter", "--kind", "eagle3", "--model", str(tiny_folder), "--dtype", "float32", "--prompts",
              str(prompts), "--max-new-tokens", "8", "--time-budget", "0.01", "--draft-vocab", "16"]
    rc, _, err = run_cli(capsys, *common, "--out", str(tmp_path / "h1"), "--data-dir", str(tmp_path / "d1"))
    assert rc == 0, err
    rc, _, err = run_cli(capsys, *common, "--out", str(tmp_path / "h2"), "--data-dir", str(tmp_path / "d2"),
                         "--max-prompts", "2", "--init-from", str(tmp_path / "h1"))
    assert rc == 0, err
    record = json.loads((tmp_path / "h2" / "training_record.json").read_text())
    assert record["kind"] == "eagle3" and set(record["heldout"]) == {"acc1", "acc2", "acc3", "chain_mat"}
    assert json.loads((tmp_path / "d2" / "index.json").read_text())["feature_layers"] == [0, 1]
    target = load_model(str(tiny_folder), dtype="float32")
    first, second = (load_eagle3_head(tmp_path / h, target) for h in ("h1", "h2"))
    assert second.feature_layers == (0, 1) and torch.equal(first.draft_ids, second.draft_ids)  # kept its vocabulary
    common = ["generate", "the cat sat", "--model", str(tiny_folder), "--dtype", "float32", "--max-new-tokens", "12"]
    rc, plain, _ = run_cli(capsys, *common, "--drafter", "none")
    rc2, drafted, err = run_cli(capsys, *common, "--drafter", "eagle", "--eagle-head", str(tmp_path / "h2"))
    assert rc == rc2 == 0 and drafted == plain, err


def test_suffix_index_build_refuses_bad_input_in_one_line(capsys, tmp_path, tiny_folder, other_vocab_folder):
    (tmp_path / "empty").mkdir()
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01")
    (tmp_path / "text.txt").write_text("the cat sat on the mat\n")
    out = tmp_path / "index.safetensors"
    build = ["suffix-index", "build", "--out", str(out)]
    rc, _, err = run_cli(capsys, *build, "--model", str(tiny_folder), str(tmp_path / "text.txt"))
    assert rc == 0, err
    written = out.read_bytes()
    for argv, message in [
        (["--model", str(tiny_folder), str(tmp_path / "text.txt"), str(tmp_path / "missing")], "input not found: "),
        (["--model", str(tiny_folder), str(tmp_path / "empty"), str(tmp_path / "blob.bin")],
         "no text to index in " + str(tmp_path / "empty")),
        (["--model", str(other_vocab_folder), str(tmp_path / "text.txt")], "whose tokenizer is not"),
        (["--model", str(other_vocab_folder), "--append", str(tmp_path / "text.txt")], "whose tokenizer is not"),
        (["--model", str(tiny_folder)], "the following arguments are required: INPUT"),
    ]:
        rc, _, err = run_cli(capsys, *build, *argv)
        lines = [line for line in err.splitlines() if line.strip()]
        assert rc == 2 and len(lines) == 1 and message in lines[0] and "Traceback" not in err, (argv, err)
    assert out.read_bytes() == written  # the file another model's build was refused is left as it was
    rc, _, err = run_cli(capsys, "suffix-index", "build", "--model", str(tiny_folder), "--out",
                         str(tmp_path / "text.txt"), str(tmp_path / "text.txt"))
    assert rc == 2 and "could not read suffix index" in err and err.count("\n") == 1


def test_a_missing_optional_extra_is_named_before_any_work(capsys, monkeypatch, tmp_path):
    """`bench --report` without matplotlib (a base install): one line naming the extra, before the run starts."""
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "c", "turns": ["hi"]}) + "\n")
    rc, out, err = run_cli(capsys, "bench", "--prompts", str(prompts), "--model", "/nonexistent-model",
                           "--report", str(tmp_path / "r"))
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert rc == 2 and len(lines) == 1 and "pip install 'specdec[bench]'" in lines[0], err


def test_an_unknown_argument_holding_a_line_separator_still_gives_one_line(capsys, tiny_folder):
    """str.splitlines breaks on \\x1e and \\u2028 too: such characters in a user's argument are written escaped."""
    rc, _, err = run_cli(capsys, "generate", "the cat", "--model", str(tiny_folder), "--dtype", "float32",
                         "--no-such-flag \x1e\u2028\n")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "\\x1e" in err


@pytest.mark.parametrize(
    "argv",
    [
        ("bench-serve", "--limit", "2", "--out", "x.json"),  # a prefix of --out-json
        ("generate", "hi", "--max-new", "4"),  # a prefix of --max-new-tokens
    ],
)
def test_an_option_given_by_a_prefix_of_its_name_is_refused(capsys, argv):
    """argparse would take a unique prefix as the option it starts: an option must be spelled whole, so that a
    guessed or mistyped one is an error rather than another option's meaning."""
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 2 and "unrecognized arguments" in err and len(err.strip().splitlines()) == 1, err
