"""`specdec bench` end to end on a tiny local model: the JSON holds what later issues are judged by."""
import json

import pytest

from specdec.cli.main import main


def test_bench_json_report_and_float32_equality(tmp_path, tiny_folder, tiny_draft_folder, capsys):
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"question_id": i, "category": c, "turns": [t]} for i, (c, t) in enumerate([
        ("a", "the cat sat on the mat"), ("b", "a big red dog ran"), ("c", "the sun and the moon"),
        ("a", "she was in the house"), ("b", "they ran up and down"), ("c", "red blue green red blue green")])]
    prompts.write_text("\n".join(json.dumps(r) for r in rows))
    out_json, report = tmp_path / "bench.json", tmp_path / "report"
    rc = main(["bench", "--prompts", str(prompts), "--limit", "4", "--max-new-tokens", "12", "--model", str(tiny_folder),
               "--dtype", "float32", "--drafters", "ngram,draft-model", "--draft-model", str(tiny_draft_folder),
               "--draft-p-min", "0.3", "--no-adaptive",  # drafts by the tokens alone, not by timings of a busy machine
               "--out-json", str(out_json), "--report", str(report)])
    assert rc == 0
    result = json.loads(out_json.read_text())
    assert result["prompts"] == 4 and result["max_new_tokens"] == 12 and result["dtype"] == "float32"
    assert result["date"].startswith("20") and "commit" in result  # the checkout's commit, None outside one
    methods = result["methods"]
    assert set(methods) == {"hf_generate", "hf_prompt_lookup", "hf_assisted", "specdec:none", "specdec:ngram",
                            "specdec:draft-model"}
    assert sorted(methods["specdec:ngram"]["per_category"]) == ["a", "b", "c"]  # round-robin over categories
    for name, m in methods.items():
        assert set(m) >= {"tokens_per_s", "speedup", "mean_accepted_tokens", "identical", "total", "per_category",
                          "divergences"}
        if name.startswith("specdec:"):
            assert m["identical"] == m["total"] == 4, m["divergences"]
            assert m["mean_accepted_tokens"] >= 1.0
            assert m["drafting_steps"] <= m["steps"]
            if m["drafting_steps"]:  # over drafting steps only: never below MAT
                assert m["mean_acceptance_length"] >= m["mean_accepted_tokens"]
            if m["drafted_tokens"]:  # a drafted token's cost, alone and against the same run's plain pass
                per_token = m["draft_time_s"] / m["drafted_tokens"]
                assert m["draft_s_per_drafted_token"] == pytest.approx(per_token)
                plain = methods["specdec:none"]
                assert m["drafted_token_over_target_pass"] == pytest.approx(
                    per_token / (plain["verify_time_s"] / plain["steps"]))
            else:
                assert m["draft_s_per_drafted_token"] is None and m["drafted_token_over_target_pass"] is None
    assert any(m.get("drafted_tokens") for m in methods.values())  # the cost figures above were checked
    assert methods["hf_generate"]["speedup"] == 1.0 and methods["hf_generate"]["mean_accepted_tokens"] is None
    assert (report / "summary.md").read_text().startswith("# specdec bench")
    assert (report / "speedup.png").stat().st_size > 1000
    assert "specdec:ngram" in capsys.readouterr().out


@pytest.mark.parametrize("penalty", ["1.0", "1.5"])
def test_bench_compares_backends_and_a_reference(tmp_path, tiny_folder, penalty):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"question_id": i, "category": "c", "turns": [t]})
                                 for i, t in enumerate(["the cat sat", "a red dog", "the sun"])))
    out_json = tmp_path / "b.json"
    rc = main(["bench", "--prompts", str(prompts), "--max-new-tokens", "8", "--model", str(tiny_folder), "--dtype",
               "float32", "--drafters", "ngram", "--no-hf", "--backends", "torch,hf", "--reference-dtype", "float32",
               "--repetition-penalty", penalty, "--out-json", str(out_json)])
    assert rc == 0
    result = json.loads(out_json.read_text())
    assert result["repetition_penalty"] == float(penalty)  # transformers' methods and the reference use it too
    methods = result["methods"]
    assert set(methods) == {"hf_generate", "specdec:none", "specdec:ngram", "specdec@hf:none", "specdec@hf:ngram"}
    for name, m in methods.items():
        assert m["identical_to_reference"] == 3  # float32 everywhere: all agree with the float32 reference
        if name.startswith("specdec"):
            assert m["identical_to_specdec_none"] == 3


def test_fidelity_script_compares_variants_with_the_reference(tmp_path, tiny_folder):
    """bench/fidelity.py: every variant's greedy output against the first's (float32 torch and transformers agree)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "bench" / "fidelity.py"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"question_id": i, "category": c, "turns": [t]}) for i, (c, t) in
                                 enumerate([("a", "the cat sat"), ("b", "a red dog"), ("a", "the sun and the moon")])))
    out = tmp_path / "fidelity.json"
    proc = subprocess.run([sys.executable, str(script), "--prompts", str(prompts), "--limit", "3", "--model",
                           str(tiny_folder), "--max-new-tokens", "10", "--variants",
                           "float32/torch,float32/hf,bfloat16/torch", "--out-json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["meta"]["reference"] == "float32/torch" and len(result["runs"]["float32/hf"]["tokens"]) == 3
    lengths = [len(t) for t in result["runs"]["float32/torch"]["tokens"]]
    assert result["summary"]["float32/hf"]["identical"] == 3
    assert result["summary"]["float32/hf"]["mean_common_prefix"] == round(sum(lengths) / 3, 2)
    assert 0 <= result["summary"]["bfloat16/torch"]["identical"] <= 3

    sys.path.insert(0, str(script.parent))
    from fidelity import compare

    assert compare([[1, 2, 3], [4, 5]], [[1, 2, 9], [4, 5]]) == {"identical": 1, "prompts": 2, "mean_common_prefix": 2,
                                                                 "median_common_prefix": 2.0}


def test_a_result_names_the_commit_its_code_came_from_even_after_the_checkout_moves(monkeypatch):
    """The commit is read as the benchmarks' runner is imported: a commit made in the checkout while a long run goes
    on (git reading another HEAD) does not rename the code that ran."""
    import subprocess

    from specdec.benchmarks import runner

    before = runner.stamp()["commit"]

    def moved_on(*args, **kwargs):
        return subprocess.CompletedProcess(args, 0, stdout="f" * 40 + "\n", stderr="")

    monkeypatch.setattr(runner.subprocess, "run", moved_on)
    assert runner.stamp()["commit"] == before != "f" * 40
