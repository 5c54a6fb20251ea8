"""Does a suffix index of the target's own answers to training prompts make the suffix drafter pay on fresh prompts?

1. The corpus: smollm2-135m's greedy answers (160 tokens at most) to a seeded random mix of
   ../shared/data/train_chat.jsonl and train_prompts.jsonl (prompts of at most 700 tokens), batched plain decoding,
   appended to CORPUS (JSONL, `completion` per record, so that `specdec suffix-index build` reads it); resumes.
2. Its greedy answers (128 tokens) to the first N Spec-Bench prompts, round-robin across categories (held out:
   never in the corpus).
3. Replays (specdec.replay, priced with the verify curve of a bench JSON) `ngram`, `suffix` from an empty index and
   `suffix` from the corpus (its first 400, 800 and all answers), adaptive, and `suffix` with the corpus at other
   `min_probability` stops; writes every figure to OUT.

    python experiments/own_answers_corpus.py CORPUS.jsonl 1600 bench/results/cpu/zen3_default_q4_1_ac82860.json 104 OUT.json
"""

import json
import random
import sys
import time
from pathlib import Path

from specdec.benchmarks.prompts import load_prompts
from specdec.costs import CostModel
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.drafters.lookup.suffix import SuffixDrafter, SuffixIndex
from specdec.engine import SpecDecoder
from specdec.models.loading import load_model
from specdec.replay import replay_drafter, replay_plain
from specdec.training.teacher import decode_batch

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
BATCH = 16


def answers(target, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Greedy answers (token ids after each prompt), BATCH prompts a pass."""
    out = []
    for b in range(0, len(prompts), BATCH):
        part = prompts[b : b + BATCH]
        for ids, res in zip(part, decode_batch(target.backend, part, new_tokens, target.info.eos_token_ids,
                                               keep_features=False)):
            out.append(res[0][len(ids):])
    return out


def corpus(target, encode, path: Path, total: int) -> list[list[int]]:
    pool = [json.loads(line)["prompt"] for name in ("train_chat.jsonl", "train_prompts.jsonl")
            for line in open(DATA / name)]
    random.Random(0).shuffle(pool)
    chosen = []
    for text in pool:
        ids = encode(text)
        if len(ids) <= 700:
            chosen.append((text, ids))
        if len(chosen) >= total:
            break
    done = sum(1 for _ in open(path)) if path.exists() else 0
    start = time.time()
    with open(path, "a") as f:
        for b in range(done, total, BATCH):
            part = chosen[b : b + BATCH]
            for (text, _), ids in zip(part, answers(target, [i for _, i in part], 160)):
                f.write(json.dumps({"prompt": text, "completion_ids": ids,
                                    "completion": target.tokenizer.decode(ids, skip_special_tokens=True)}) + "\n")
            f.flush()
            print(f"corpus {b + len(part)}/{total}, {time.time() - start:.0f} s", flush=True)
    return [json.loads(line)["completion_ids"] for line in open(path)]


def main(corpus_path: str, total: int, bench_json: str, n_prompts: int, out: str) -> None:
    target = load_model("smollm2-135m")
    encode = SpecDecoder(target, None).encode
    sequences = corpus(target, encode, Path(corpus_path), total)
    prompts = load_prompts(DATA / "specbench_dev.jsonl", n_prompts)
    ids = [encode(p.text) for p in prompts]
    requests = [{"prompt_ids": i, "output_ids": o, "max_new_tokens": 128}
                for i, o in zip(ids, answers(target, ids, 128))]
    curve = {int(k): v for k, v in json.load(open(bench_json))["verify_costs_s"].items()}
    plain = replay_plain(requests, CostModel(curve))

    def index(first: int) -> SuffixIndex:
        shared = SuffixIndex()
        shared.store_all(sequences[:first])
        return shared

    runs = {"ngram": lambda: NgramDrafter(), "suffix, empty index": lambda: SuffixDrafter()}
    for first in (400, 800, len(sequences)):
        runs[f"suffix, first {first} answers"] = lambda first=first: SuffixDrafter(shared=index(first))
    for stop in (0.2, 0.35, 0.5):
        runs[f"suffix, all answers, min_probability {stop}"] = lambda stop=stop: SuffixDrafter(
            min_probability=stop, shared=index(len(sequences)))
    rows = []
    for name, make in runs.items():
        r = replay_drafter(requests, make, name, curve, None)
        rows.append(r.to_dict(plain))
        print(f"{name:45s} MAT {r.mean_accepted_tokens:.3f} accepted {r.acceptance_rate:.3f} "
              f"predicted {plain.seconds / r.seconds:.3f}x plain", flush=True)
    Path(out).write_text(json.dumps({
        "corpus": {"answers": len(sequences), "tokens": sum(map(len, sequences)), "file": corpus_path},
        "prompts": n_prompts, "verify_costs_s": curve, "bench_json": bench_json, "policies": rows,
    }, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5])
