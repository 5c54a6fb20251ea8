"""Prompt lookup's settings on smollm2-135m's Q4_1 file, the 26 floor prompts, 128 tokens: first replayed over plain
decoding's outputs (specdec.replay, priced by a bench JSON's verify curve), then run, alternated prompt by prompt in
one process (experiments/alternate.py): `ngram` with n from 4 down to 2 (shipped) or 1, `suffix` down to 2 or 1.

    python experiments/lookup_settings.py ../shared/data/specbench_dev.jsonl bench.json
"""

import sys

from alternate import alternate

from specdec import SpecDecoder
from specdec.benchmarks.prompts import load_prompts
from specdec.choice import PLAIN, DrafterChoice
from specdec.config import GenerationConfig
from specdec.costs import CostModel
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.drafters.lookup.suffix import SuffixDrafter
from specdec.replay import replay_drafter, replay_plain

SETTINGS = {
    "ngram 4..2": lambda: NgramDrafter(2, 4),
    "ngram 4..1": lambda: NgramDrafter(1, 4),
    "suffix 8..2": lambda: SuffixDrafter(2, 8),
    "suffix 8..1": lambda: SuffixDrafter(1, 8),
}


def main(prompt_file: str, bench_json: str) -> None:
    import json

    decoder = SpecDecoder.load("smollm2-135m", drafter="ngram")
    prompts = load_prompts(prompt_file, 26)
    config = GenerationConfig(max_new_tokens=128)
    requests = []
    for p in prompts:
        ids = decoder.encode(p.text)
        requests.append({"prompt_ids": list(ids), "output_ids": decoder.generate_ids(list(ids), config)[0]})
    curve = {int(k): v for k, v in json.load(open(bench_json))["verify_costs_s"].items()}
    plain = replay_plain(requests, CostModel(curve))
    for name, make in SETTINGS.items():
        r = replay_drafter(requests, make, name, curve, None)
        print(f"replayed {name}: MAT {r.mean_accepted_tokens:.3f}, passes {plain.seconds / r.seconds:.3f}x plain's")
    drafters = {name: make() for name, make in SETTINGS.items()}
    for d in drafters.values():
        decoder.warm_up(drafter=d)
    totals, equal = alternate(
        decoder, prompts, config, {"none": PLAIN, **{n: DrafterChoice(d) for n, d in drafters.items()}}
    )
    for name, t in totals.items():
        speedup = t["tokens_per_s"] / totals["none"]["tokens_per_s"]
        print(f"run {name}: {t['tokens_per_s']:.1f} tokens/s, {speedup:.3f}x, MAT {t['mean_accepted_tokens']:.3f}")
    print(f"{equal}/{len(prompts)} prompts equal for every method")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
