"""Does a draft model drafting a batch in shared passes (DraftModelDrafter.propose_together) beat each request
drafting alone? smollm2-135m's Q4_1 file drafting for itself (the only GGUF at hand with its tokenizer: every draft
is accepted, so both runs draft the same tokens and only the drafting passes differ), 4 tokens a step without the
adaptive policy, the first N Spec-Bench prompts in batches of B, 64 tokens each; shared passes on and off
alternated in one process (off: pass_sharing returns None, so each request drafts alone), outputs compared with
plain decoding's.

    python experiments/draft_model_batch.py 16 4 4 OUT.json
"""

import datetime
import glob
import json
import subprocess
import sys
import time
from pathlib import Path

from specdec import SpecDecoder
from specdec.benchmarks.prompts import load_prompts
from specdec.benchmarks.runner import machine_info
from specdec.config import GenerationConfig
from specdec.drafters.models.draft_model import DraftModelDrafter

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def main(n: int, batch: int, rounds: int, out: str) -> None:
    gguf = glob.glob(str(Path.home() / ".cache/specdec/gguf/smollm2-135m/*.gguf"))[0]
    config = GenerationConfig(max_new_tokens=64)
    plain = SpecDecoder.load("smollm2-135m", drafter="none")
    prompts = [plain.encode(p.text) for p in load_prompts(DATA / "specbench_dev.jsonl", n)]
    want = [plain.generate_ids(p, config)[0] for p in prompts]
    spec = SpecDecoder.load("smollm2-135m", drafter="draft-model", draft_model=gguf, adaptive=False,
                            num_speculative_tokens=4)
    sharing = DraftModelDrafter.pass_sharing
    seconds: dict[str, list[float]] = {"shared": [], "alone": []}
    for r in range(rounds):
        for mode in ("shared", "alone") if r % 2 == 0 else ("alone", "shared"):
            DraftModelDrafter.pass_sharing = sharing if mode == "shared" else (lambda self: None)
            start = time.perf_counter()
            outs = spec.generate_many(prompts, config, max_batch=batch)
            seconds[mode].append(time.perf_counter() - start)
            same = sum(o.token_ids == w for o, w in zip(outs, want))
            print(f"round {r} {mode}: {seconds[mode][-1]:.2f} s, {same}/{n} equal to plain decoding", flush=True)
    DraftModelDrafter.pass_sharing = sharing
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    runs = json.loads(Path(out).read_text()) if Path(out).exists() else []
    runs.append({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "commit": commit, "machine": machine_info(), "prompts": n, "max_new_tokens": 64,
                 "num_speculative_tokens": 4, "max_batch": batch, "seconds": seconds,
                 "alone_over_shared_best": min(seconds["alone"]) / min(seconds["shared"])})
    Path(out).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
