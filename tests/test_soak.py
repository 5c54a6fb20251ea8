"""A one-minute soak of a real server process (`specdec bench-serve --soak 1`): mixed requests, identical prompts
together, dropped streams and one-token requests at concurrency 8, on a server with room for 6 (4 running, 2
queued), so that 429s come and are retried after their Retry-After; nothing is lost and nothing answers 5xx."""
import json

import pytest

pytest.importorskip("fastapi")

from specdec.cli.main import main  # noqa: E402
from specdec.benchmarks.soak import KINDS  # noqa: E402


def test_a_one_minute_soak_loses_nothing(tiny_bpe_folder, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": "c", "turns": [t]}) + "\n" for i, t in
                               enumerate(["Tell me about cats.", "What is the sun?", "Write a poem about rain.",
                                          "Summarize: the dog ran home.", "Translate: guten Tag"])))
    out = tmp_path / "soak.json"
    rc = main(["bench-serve", "--soak", "1", "--concurrency", "8", "--model", str(tiny_bpe_folder), "--dtype",
               "float32", "--threads", "1", "--prompts", str(prompts), "--max-tokens", "12", "--max-batch", "4",
               "--max-queue", "2", "--max-context", "512", "--out-json", str(out)])
    summary = json.loads(out.read_text())
    totals = summary["totals"]
    assert rc == 0, (totals, summary["errors"])
    assert totals["lost"] == 0 and totals["http_5xx"] == 0 and totals["requests"] >= 50
    assert totals["http_429_retried"] > 0 and not any(r["http_status"] == 429 for r in summary["requests"])
    assert totals["dropped"] > 0 and totals["ok"] > totals["requests"] / 2
    assert all(summary["by_kind"][k]["requests"] > 0 for k in KINDS)
    assert len(summary["memory"]) >= 5 and all(m["rss_bytes"] for m in summary["memory"])
    assert summary["windows"][0]["latency_s"]["p99"] is not None
    assert summary["meta"]["client_timeout_s"] == 120 and summary["meta"]["max_context"] == 512
    assert summary["meta"]["date"].startswith("20") and "commit" in summary["meta"]
