"""bench/traffic_loop.py: the workload split and the chunked tracing that lets the loop resume; the flag it trains
with. The loop itself runs the real model for an hour (docs/training.md, "Training on your own traffic")."""
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import traffic_loop  # noqa: E402


def _chat_file(tmp_path: Path) -> Path:
    rows = [{"source": f"ted-german:{i}", "prompt": f"Übersetze Satz {i}"} for i in range(30)]
    rows += [{"source": "t0:x", "prompt": f"other {i}"} for i in range(10)]
    rows.append({"source": "ted-german:dup", "prompt": "Übersetze Satz 3"})  # a repeated prompt counts once
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    return path


def test_traffic_and_held_back_requests_share_no_prompt_and_are_stable(tmp_path):
    path = _chat_file(tmp_path)
    traffic, held_back = traffic_loop.workload(path, "ted-german", 20, 8)
    assert len(traffic) == 20 and len(held_back) == 8 and not set(traffic) & set(held_back)
    assert all(p.startswith("Übersetze") for p in traffic + held_back)
    assert (traffic, held_back) == traffic_loop.workload(path, "ted-german", 20, 8)
    # fewer traffic requests keep the first ones: chunks already served stay valid
    assert traffic_loop.workload(path, "ted-german", 10, 8)[0] == traffic[:10]


def test_a_family_too_small_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="has 30 prompts, fewer than asked for"):
        traffic_loop.workload(_chat_file(tmp_path), "ted-german", 25, 8)


def test_a_chunks_trace_joins_the_traces_only_once_whole(tmp_path, monkeypatch):
    traces, partial = tmp_path / "traces", tmp_path / "partial-trace"
    partial.mkdir()
    (partial / "stopped-half-way.jsonl").write_text("{}\n")  # left by a chunk that was stopped

    def served(prompts, args, max_tokens, concurrency):
        folder = Path(args[args.index("--trace") + 1])
        assert not folder.exists() or not any(folder.iterdir()), "a stopped chunk's trace was kept"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "trace-1.jsonl").write_text("\n".join(prompts))
        return {"requests": len(prompts)}

    monkeypatch.setattr(traffic_loop, "serve", served)
    options = SimpleNamespace(max_tokens=16, concurrency=2)
    assert traffic_loop.serve_traced(["a", "b"], traces, "head", options) == {"requests": 2}
    assert [p.name for p in traces.iterdir()] == ["trace-1.jsonl"]
    assert (traces / "trace-1.jsonl").read_text() == "a\nb" and not list(partial.glob("*.jsonl"))


def test_resume_from_is_the_flag_that_fine_tunes_a_served_head():
    from specdec.cli.main import build_parser

    args = build_parser().parse_args(["train-drafter", "--data", "traces/", "--resume-from", "heads/served",
                                      "--out", "heads/new"])
    assert args.init_from == "heads/served"
