"""The options of `specdec train-drafter`: the head's kind and shape, the data (self-distilled from the target, or
given), the training budget and the target it is trained for."""

from __future__ import annotations

import argparse

from ..config import DTYPES


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kind",
        default="eagle",
        choices=("eagle", "eagle3", "medusa"),
        help="eagle: one decoder layer on the target's features and the next token, drafting step by "
        "step; eagle3: the same on the target's states at three depths, trained on tokens only, "
        "saved in the EAGLE-3 authors' layout; medusa: one small residual head per drafted "
        "position, all drafting in one pass",
    )
    p.add_argument(
        "--feature-layers",
        default=None,
        metavar="I,J,K",
        help="eagle3: the target layers whose inputs the head reads (default: 2, L/2 and L-3 of L)",
    )
    p.add_argument("--model", default=None, help="target model (default: smollm2-135m)")
    p.add_argument("--out", required=True, help="folder for the head (safetensors + config naming its target)")
    p.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="FILE[:WEIGHT]",
        help="training records, JSONL with a 'prompt' and optionally a 'response' (read by teacher "
        "forcing; without one the target answers), or a server's traces (serve --trace); a folder "
        "means its .jsonl files; repeatable, mixed by WEIGHT (share of records, default 1). "
        "Default: the mix in docs/training.md, from ../shared/data",
    )
    p.add_argument("--prompts", default=None, metavar="FILE", help="the same as --data FILE")
    p.add_argument(
        "--max-prompts",
        type=int,
        default=None,
        help="use this many records of the mix, in its order (0: synthetic prompts only)",
    )
    p.add_argument(
        "--follow-up-every",
        type=int,
        default=4,
        metavar="N",
        help="every Nth record the target answers gets a second user turn, answered too (0: none)",
    )
    p.add_argument(
        "--labels",
        default="top1",
        choices=("top1", "soft"),
        help="learn the target's top choice, or its top-8 distribution (soft labels)",
    )
    p.add_argument(
        "--synthesize",
        type=int,
        default=0,
        metavar="N",
        help="also answer N prompts the target writes itself, each opening with a few words of a "
        "training prompt (Self-Instruct style, sampled; more varied than the prompt file)",
    )
    p.add_argument(
        "--document-tasks",
        type=int,
        default=0,
        metavar="N",
        help="also answer N tasks about texts the target wrote (its answers in this run's data and "
        "--extra-data): summaries, questions, extraction, rewriting; the long-context work the "
        "prompt file lacks",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sample the answers at this temperature (0: greedy); the head always learns the target's greedy choices",
    )
    p.add_argument(
        "--data-dir",
        default=None,
        help="where self-distilled data is cached (default: in the specdec cache, a folder per data setting)",
    )
    p.add_argument(
        "--extra-data",
        action="append",
        default=[],
        metavar="DIR",
        help="train on this cached data too (another run's --data-dir for the same target); repeatable",
    )
    p.add_argument(
        "--exclude-source",
        action="append",
        default=[],
        metavar="FAMILY",
        help="leave out the records of this source family (the source up to its first ':', as "
        "training_record.json lists them), e.g. teacher-forced answers; repeatable",
    )
    p.add_argument(
        "--repeat-source",
        action="append",
        default=[],
        metavar="FAMILY:N",
        help="train on this source family's sequences N times per epoch (its held-out ones once), e.g. "
        "to keep what an --init-from head knew; repeatable",
    )
    p.add_argument(
        "--init-from",
        "--resume-from",
        dest="init_from",
        default=None,
        metavar="DIR",
        help="start from this trained head's weights instead of fresh ones (fine-tuning it, e.g. on "
        "traces of your own traffic)",
    )
    p.add_argument(
        "--authors-layout",
        action="store_true",
        help="eagle: no norm before attention and no fc bias, the layout of the EAGLE authors' heads that "
        "vLLM and SGLang run (export-head takes it for either); an --init-from head with a norm has it "
        "folded into the attention's projections first",
    )
    p.add_argument("--max-new-tokens", type=int, default=256, help="longest answer generated per prompt")
    p.add_argument("--batch-size", type=int, default=16, help="prompts answered together")
    p.add_argument("--time-budget", type=float, default=60.0, help="training minutes (data generation not counted)")
    p.add_argument("--draft-vocab", type=int, default=8192, help="tokens the head can propose (the most frequent)")
    p.add_argument("--steps", type=int, default=3, help="drafting steps unrolled in training (eagle)")
    p.add_argument("--medusa-num-heads", type=int, default=4, help="Medusa heads: tokens drafted ahead (medusa)")
    p.add_argument("--medusa-num-layers", type=int, default=1, help="residual blocks per Medusa head (medusa)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="target dtype for data generation")
    p.add_argument("--data-only", action="store_true", help="generate (or complete) the data, then stop")
