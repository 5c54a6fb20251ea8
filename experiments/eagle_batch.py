"""Do EAGLE chains drafted together (EagleDrafter.propose_together) beat each request drafting its chain alone?
smollm2-135m's Q4_1 file with the shipped head, the first N Spec-Bench prompts in batches of B, 64 tokens each,
3 tokens a step without the adaptive policy (so both modes draft the same chains and only the drafting passes
differ), shared passes on and off alternated in one process (off: pass_sharing returns None, so each request drafts
alone), the time in the steps' drafting (scheduler.propose_all) recorded apart; plain decoding in the same batches for scale; every output compared with plain decoding's.

    python experiments/eagle_batch.py 16 4 4 OUT.json
"""

import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

from specdec import SpecDecoder
from specdec.benchmarks.prompts import load_prompts
from specdec.benchmarks.runner import machine_info
from specdec.config import GenerationConfig
from specdec import scheduler
from specdec.drafters.heads.eagle import EagleDrafter

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def main(n: int, batch: int, rounds: int, out: str) -> None:
    config = GenerationConfig(max_new_tokens=64)
    plain = SpecDecoder.load("smollm2-135m", drafter="none")
    prompts = [plain.encode(p.text) for p in load_prompts(DATA / "specbench_dev.jsonl", n)]
    want = [plain.generate_ids(p, config)[0] for p in prompts]
    spec = SpecDecoder.load("smollm2-135m", drafter="eagle", adaptive=False, num_speculative_tokens=3)
    sharing = EagleDrafter.pass_sharing
    seconds: dict[str, list[float]] = {"shared": [], "alone": [], "plain": []}
    drafting: dict[str, list[float]] = {"shared": [], "alone": []}  # seconds in the steps' propose_all
    propose_all, spent = scheduler.propose_all, [0.0]

    def timed(*args):
        start = time.perf_counter()
        drafts = propose_all(*args)
        spent[0] += time.perf_counter() - start
        return drafts

    scheduler.propose_all = timed
    for r in range(rounds):
        for mode in ("shared", "alone", "plain") if r % 2 == 0 else ("plain", "alone", "shared"):
            EagleDrafter.pass_sharing = sharing if mode == "shared" else (lambda self: None)
            decoder = plain if mode == "plain" else spec
            start, spent[0] = time.perf_counter(), 0.0
            outs = decoder.generate_many(prompts, config, max_batch=batch)
            seconds[mode].append(time.perf_counter() - start)
            if mode in drafting:
                drafting[mode].append(spent[0])
            same = sum(o.token_ids == w for o, w in zip(outs, want))
            print(
                f"round {r} {mode}: {seconds[mode][-1]:.2f} s (drafting {spent[0]:.2f}), {same}/{n} equal to plain",
                flush=True,
            )
    EagleDrafter.pass_sharing = sharing
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    runs = json.loads(Path(out).read_text()) if Path(out).exists() else []
    runs.append(
        {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": commit,
            "machine": machine_info(),
            "prompts": n,
            "max_new_tokens": 64,
            "num_speculative_tokens": 3,
            "max_batch": batch,
            "seconds": seconds,
            "drafting_seconds": drafting,
            "drafting_alone_over_shared_best": min(drafting["alone"]) / min(drafting["shared"]),
            "alone_over_shared_best_whole": min(seconds["alone"]) / min(seconds["shared"]),
            "plain_over_shared_best": min(seconds["plain"]) / min(seconds["shared"]),
        }
    )
    Path(out).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
