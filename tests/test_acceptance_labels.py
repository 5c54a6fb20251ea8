"""Every output a LOSSY acceptance rule made says so: CLI stats, bench JSON, server responses, /health and
/metrics; exact acceptance is the default and says lossy: false; bad rules are refused in one line or a 400."""
import json

import pytest

from cli_runner import run_cli


def test_generate_labels_lossy_output_in_its_stats_and_says_so(capsys, tiny_folder):
    common = ["generate", "the cat sat on the mat the cat", "--model", str(tiny_folder), "--dtype", "float32",
              "--max-new-tokens", "10", "--drafter", "ngram", "--stats-json"]
    rc, _, err = run_cli(capsys, *common)
    stats = json.loads(err.strip().splitlines()[-1])
    assert rc == 0 and stats["lossy"] is False and stats["acceptance"] == "exact" and "LOSSY" not in err
    rc, _, err = run_cli(capsys, *common, "--acceptance", "top-k:03")
    stats = json.loads(err.strip().splitlines()[-1])
    assert rc == 0 and stats["lossy"] is True and stats["acceptance"] == "top-k:3"
    assert "note: LOSSY acceptance top-k:3" in err


@pytest.mark.parametrize("command", ["generate", "serve", "bench"])
@pytest.mark.parametrize("rule", ["foo", "top-k:0", "threshold:2", "typical:x"])
def test_a_bad_acceptance_rule_is_one_line_and_a_nonzero_exit(capsys, command, rule):
    argv = {"generate": ["generate", "hi"], "serve": ["serve"], "bench": ["bench", "--prompts", "p.jsonl"]}[command]
    rc, out, err = run_cli(capsys, *argv, "--acceptance", rule if command != "bench" else f"exact,{rule}")
    assert rc == 2 and not out
    assert len(err.strip().splitlines()) == 1 and "acceptance must be exact, top-k:K" in err


def test_a_lossy_rule_without_a_drafter_is_refused(capsys, tiny_folder):
    rc, out, err = run_cli(capsys, "generate", "hi", "--model", str(tiny_folder), "--drafter", "none",
                           "--acceptance", "threshold:0.2")
    assert rc == 2 and not out and len(err.strip().splitlines()) == 1 and "--drafter none drafts nothing" in err


def test_bench_runs_each_rule_as_a_method_labelled_in_its_json(capsys, tmp_path, tiny_folder):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"question_id": i, "category": "c", "turns": [t]}) for i, t in
                                 enumerate(["the cat sat on the mat the cat sat", "a red dog ran to a red dog"])))
    out_json = tmp_path / "b.json"
    rc, out, _ = run_cli(capsys, "bench", "--prompts", str(prompts), "--max-new-tokens", "10", "--model",
                         str(tiny_folder), "--dtype", "float32", "--drafters", "ngram", "--no-hf", "--no-adaptive",
                         "-k", "3", "--acceptance", "exact,top-k:8", "--out-json", str(out_json))
    assert rc == 0
    result = json.loads(out_json.read_text())
    methods = result["methods"]
    assert set(methods) == {"hf_generate", "specdec:none", "specdec:ngram", "specdec:ngram[top-k:8]"}
    assert result["acceptance"] == ["exact", "top-k:8"]
    for name in ("hf_generate", "specdec:none", "specdec:ngram"):
        assert methods[name]["lossy"] is False and methods[name]["acceptance"] == "exact"
    lossy = methods["specdec:ngram[top-k:8]"]
    assert lossy["lossy"] is True and lossy["acceptance"] == "top-k:8"
    exact = methods["specdec:ngram"]["differs_from_plain"]  # float32: exact speculation is plain decoding
    assert exact["token_mismatch_share"] == exact["diverged_share"] == 0 and exact["identical"] == 2
    assert lossy["differs_from_plain"]["identical"] == lossy["identical_to_specdec_none"]
    assert "LOSSY (top-k:8" in out  # on its row of the console table


@pytest.fixture(scope="module")
def served(tiny_folder):
    """An in-process server whose default rule is lossy, and a client for it."""
    pytest.importorskip("fastapi")
    from starlette.testclient import TestClient

    from specdec.speculation_config import SpeculationConfig
    from specdec.drafters.lookup.ngram import NgramDrafter
    from specdec.engine import SpecDecoder
    from specdec.models.loading import load_model
    from specdec.server.app import create_app
    from specdec.server.state import ServerSettings

    decoder = SpecDecoder(load_model(str(tiny_folder), dtype="float32"), NgramDrafter(1, 3),
                          SpeculationConfig(num_speculative_tokens=3, adaptive=False, acceptance="threshold:0.05"))
    with TestClient(create_app(decoder, ServerSettings(model_name="tiny", max_batch=2))) as client:
        yield client


def _speculation(client, **speculation) -> dict:
    body = {"model": "tiny", "prompt": "the cat sat on the mat the cat sat", "max_tokens": 8, "temperature": 0,
            "ignore_eos": True, **({"speculation": speculation} if speculation else {})}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["usage"]["speculation"]


def test_server_responses_health_and_metrics_label_the_rule(served):
    assert served.get("/health").json()["acceptance"] == "threshold:0.05" and served.get("/health").json()["lossy"]
    lossy = _speculation(served)  # the server's default rule
    assert lossy["lossy"] is True and lossy["acceptance"] == "threshold:0.05"
    exact = _speculation(served, acceptance="exact")  # a request may ask for exact acceptance
    assert exact["lossy"] is False and exact["acceptance"] == "exact"
    plain = _speculation(served, enabled=False)  # nothing drafted: exact whatever the server's rule
    assert plain["lossy"] is False and plain["acceptance"] == "exact"
    chosen = _speculation(served, acceptance="top-k:2")
    assert chosen["lossy"] is True and chosen["acceptance"] == "top-k:2"
    metrics = served.get("/metrics").text  # 8 tokens a request: the exact series holds two requests' tokens
    for labels, tokens in (('acceptance="threshold:0.05",lossy="true"', 8), ('acceptance="exact",lossy="false"', 16),
                           ('acceptance="top-k:2",lossy="true"', 8)):
        assert f"specdec_generation_tokens_by_acceptance_total{{{labels}}} {tokens:.1f}" in metrics, labels


@pytest.mark.parametrize("value,kind", [("top-k:0", "invalid_value"), ("foo", "invalid_value"),
                                        (3, "invalid_type")])
def test_a_bad_acceptance_in_a_request_is_a_400_naming_the_field(served, value, kind):
    response = served.post("/v1/completions", json={"model": "tiny", "prompt": "the", "max_tokens": 2,
                                                    "speculation": {"acceptance": value}})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "speculation.acceptance" and error["code"] == kind


def test_traces_record_the_rule_and_replays_leave_lossy_requests_out(tmp_path):
    """A replay judges drafts by exact agreement with the output: a lossy request's logged steps are not that."""
    from specdec.config import GenerationConfig
    from specdec.speculation_config import SpeculationConfig
    from specdec.drafters.lookup.ngram import NgramDrafter
    from specdec.engine import SpecDecoder
    from specdec.costs import CostModel
    from specdec.replay import replayable
    from specdec.trace import read_trace
    from tiny import loaded, tiny_llama

    target = loaded(tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2))
    path = tmp_path / "trace.jsonl"
    for rule in ("exact", "top-k:4"):
        decoder = SpecDecoder(target, NgramDrafter(1, 3), SpeculationConfig(num_speculative_tokens=3, acceptance=rule),
                              costs=CostModel({1: 0.01, 4: 0.012}))
        decoder.trace_to(path)
        decoder.generate_ids([5, 6, 7, 5, 6, 7, 5, 6], GenerationConfig(max_new_tokens=6, ignore_eos=True))
    _, records = read_trace(path)
    assert [r["acceptance"] for r in records] == ["exact", "top-k:4"]
    assert [r["acceptance"] for r in replayable(records)] == ["exact"]
