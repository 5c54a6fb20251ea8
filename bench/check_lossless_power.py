"""Does `specdec check-lossless` catch a subtle sampling bug on the real model at its default sample size?

    python bench/check_lossless_power.py --out-json bench/results/cpu/check_lossless_power_eagle_f32.json

Runs check-lossless's sampling tests (its default settings and sample size, EAGLE drafting a chain of k = 2 with
its own q, float32) twice: with specdec's rejection sampling, and with a broken rule that keeps the right acceptance
test but redraws a rejected position from p instead of norm(max(0, p - q)), the mistake losslessness hinges on.
"""
from __future__ import annotations

import argparse
import json

import torch

from specdec import SpecDecoder, verify
from specdec.cli.check import PROMPTS, SETTINGS, parse_setting
from specdec.lossless import LosslessReport, check_sampling
from specdec.verify import rejection_verify


def resample_from_p(draft, draft_probs, target_probs, generator):
    """Broken: the right acceptance test, but a rejected position is redrawn from p."""
    n, _ = rejection_verify(draft, draft_probs, target_probs, generator)
    return n, int(torch.multinomial(target_probs[n], 1, generator=generator))


def run(decoder, ids, samples: int) -> dict:
    report = LosslessReport()
    for setting in SETTINGS:
        report.sampling.append(check_sampling(decoder, ids, parse_setting(setting), samples, 4, decoder.speculation))
    return report.to_dict()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--out-json", required=True)
    args = parser.parse_args()
    decoder = SpecDecoder.load("smollm2-135m", drafter="eagle", dtype="float32", num_speculative_tokens=2,
                               adaptive=False, tree=False)
    decoder.enable_prefix_cache(4)
    ids = decoder.encode(PROMPTS[0])
    results = {"correct": run(decoder, ids, args.samples)}
    verify.rejection_verify = resample_from_p
    results["resample_from_p"] = run(decoder, ids, args.samples)
    for name, report in results.items():
        print(f"{name}: {'passed' if report['passed'] else 'FAILED'}; "
              + "; ".join(f"{t['name']} p={t['p_value']:.2g}" for c in report["sampling"] for t in c["tests"]))
    with open(args.out_json, "w", encoding="utf-8") as f:
        json.dump({"model": "smollm2-135m", "dtype": "float32", "drafter": "eagle (chain, k=2)",
                   "prompt": PROMPTS[0], "samples": args.samples, **results}, f, indent=1)


if __name__ == "__main__":
    main()
