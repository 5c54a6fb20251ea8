"""From traffic to drafter: serve a workload with traces on, fine-tune the served head on the traces, and measure
MAT on requests of the same workload that were held back, before and after.

    python bench/traffic_loop.py --family ted-german --traffic 300 --held-back 60 --train-minutes 20 \
        --work $SPECDEC_CACHE/traffic-loop --out-json bench/results/cpu/traffic_loop_ted_german.json

The workload is one family of prompts from ../shared/data/train_chat.jsonl (by its `source`, e.g. German to
English translation), shuffled with a fixed seed and split into traffic and held-back requests that share no
prompt. Steps, each resumable (a step whose output exists is skipped):
1. `specdec serve --drafter eagle --trace DIR` answers the traffic (greedy chat completions, a few at a time), in
   chunks of 50 requests, one server each; a chunk's trace joins WORK/traces/ once it is whole;
2. `specdec train-drafter --data WORK/traces/ --resume-from HEAD` fine-tunes the head the server used;
3. the held-back requests are served with the head before and after (the same server options, drafting at every
   step), and MAT (tokens per target pass, from `usage.speculation`) is summed over them.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from specdec.benchmarks.runner import machine_info
from specdec.drafters import bundled_head
from specdec.models.registry import DEFAULT_MODEL
from specdec.benchmarks.server_process import ServerProcess
from specdec.training.datamix import source_family

CHUNK = 50  # traffic requests per server run
CHAT = Path(__file__).resolve().parents[2] / "shared" / "data" / "train_chat.jsonl"


def workload(path: Path, family: str, traffic: int, held_back: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    prompts = sorted({row["prompt"] for row in rows if source_family(row.get("source", "")) == family})
    random.Random(seed).shuffle(prompts)
    if len(prompts) < traffic + held_back:
        sys.exit(f"traffic_loop: the family {family!r} has {len(prompts)} prompts, fewer than asked for")
    return prompts[:traffic], prompts[traffic:traffic + held_back]


def serve(prompts: list[str], args: list[str], max_tokens: int, concurrency: int) -> dict:
    """Answers every prompt through a fresh server; the speculation statistics summed over them."""
    import httpx

    with ServerProcess(["--dtype", "float32", "--drafter", "eagle", *args]) as server:
        def one(prompt: str) -> dict:
            # drafting on at every step (no cost model deciding to skip it), so MAT measures the head alone
            body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
                    "max_tokens": max_tokens, "speculation": {"adaptive": False}}
            answer = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=600)
            answer.raise_for_status()
            return answer.json()["usage"]["speculation"]

        with ThreadPoolExecutor(concurrency) as pool:
            stats = list(pool.map(one, prompts))
    tokens = sum(s["accepted_tokens"] for s in stats) + sum(s["verify_steps"] for s in stats)
    return {"requests": len(stats), "verify_steps": sum(s["verify_steps"] for s in stats),
            "drafted_tokens": sum(s["drafted_tokens"] for s in stats),
            "accepted_tokens": sum(s["accepted_tokens"] for s in stats),
            "mat": round(tokens / max(1, sum(s["verify_steps"] for s in stats)), 3)}


def serve_traced(prompts: list[str], traces: Path, head: str, args) -> dict:
    """Serves one chunk of the traffic with traces on; its trace file joins `traces` only once the chunk is whole,
    so a chunk stopped half-way is served again from the start without leaving its first requests twice."""
    partial = traces.parent / "partial-trace"
    shutil.rmtree(partial, ignore_errors=True)
    stats = serve(prompts, ["--trace", f"{partial}/", "--eagle-head", head], args.max_tokens, args.concurrency)
    traces.mkdir(parents=True, exist_ok=True)
    for path in sorted(partial.glob("*.jsonl")):
        path.rename(traces / path.name)
    return stats


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", default="ted-german")
    p.add_argument("--traffic", type=int, default=300)
    p.add_argument("--held-back", type=int, default=60)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--train-minutes", type=float, default=20)
    p.add_argument("--head", default=None, help="the head served first (default: the shipped EAGLE head)")
    p.add_argument("--work", required=True, help="folder for the traces, the new head and the steps' results")
    p.add_argument("--out-json", required=True)
    args = p.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    head = args.head or str(bundled_head(DEFAULT_MODEL))
    traffic, held_back = workload(CHAT, args.family, args.traffic, args.held_back)
    steps = work / "steps.json"
    done = json.loads(steps.read_text()) if steps.is_file() else {}

    def step(name: str, run):
        if name not in done:
            done[name] = run()
            steps.write_text(json.dumps(done, indent=1))
        print(name, json.dumps(done[name]), file=sys.stderr)

    traces = work / "traces"
    for first in range(0, len(traffic), CHUNK):  # a stop loses at most the chunk being served
        step(f"traffic-{first // CHUNK}", lambda: serve_traced(traffic[first:first + CHUNK], traces, head, args))
    step("before", lambda: serve(held_back, ["--eagle-head", head], args.max_tokens, args.concurrency))
    tuned = work / "head"
    command = [sys.executable, "-m", "specdec.cli.main", "train-drafter", "--data", str(traces), "--resume-from",
               head, "--lr", "5e-4", "--dtype", "float32", "--out", str(tuned),
               "--time-budget", str(args.train_minutes)]
    step("train", lambda: {"command": command[2:], "exit": subprocess.run(command).returncode,
                           "record": json.loads((tuned / "training_record.json").read_text())["heldout"]})
    step("after", lambda: serve(held_back, ["--eagle-head", str(tuned)], args.max_tokens, args.concurrency))
    chunks = [done[name] for name in done if name.startswith("traffic-")]
    served = {key: sum(c[key] for c in chunks) for key in ("requests", "verify_steps", "drafted_tokens",
                                                           "accepted_tokens")}
    result = {"family": args.family, "traffic_requests": len(traffic), "held_back_requests": len(held_back),
              "max_tokens": args.max_tokens, "head_before": head, "head_after": str(tuned), **done, "traffic": served,
              "mat_gain": round(done["after"]["mat"] - done["before"]["mat"], 3), "machine": machine_info()}
    Path(args.out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out_json).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("mat_gain",)} | {"before": done["before"]["mat"],
                                                                "after": done["after"]["mat"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
