"""`specdec export-head`: write an EAGLE or EAGLE-3 head in the layout vLLM and SGLang serve (docs/scale-out.md)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError

ENGINE_HINTS = {  # how each engine serves the folder; TARGET is the target's checkpoint, DIR the folder
    "vllm": 'vllm serve TARGET --speculative-config \'{{"method": "{method}", "model": "{out}", '
    '"num_speculative_tokens": 5}}\'',
    "sglang": "python -m sglang.launch_server --model-path TARGET --speculative-algorithm {algorithm} "
    "--speculative-draft-model-path {out} --speculative-num-steps 5 --speculative-eagle-topk 4 "
    "--speculative-num-draft-tokens 8",
}


ENGINES, DTYPES = ("vllm", "sglang"), ("bfloat16", "float16", "float32")  # head_export's (without importing torch)


def register(sub) -> None:
    p = sub.add_parser(
        "export-head",
        help="write an EAGLE or EAGLE-3 head as vLLM and SGLang load it (config.json + model.safetensors)",
    )
    p.add_argument("--model", default=None, help="the target the head drafts for (default: smollm2-135m)")
    p.add_argument(
        "--drafter",
        default="eagle3",
        choices=("eagle", "eagle3"),
        help="the kind of head: eagle3 (one folder both engines load; default) or eagle (EAGLE-1/2)",
    )
    p.add_argument(
        "--head",
        default=None,
        metavar="DIR",
        help="the head's folder, in specdec's layout or its authors' (default: the head --drafter uses "
        "for the model, shipped with specdec)",
    )
    p.add_argument(
        "--engine",
        default=None,
        choices=ENGINES,
        help="the engine the folder is for: needed for EAGLE-1/2 heads, which vLLM and SGLang load "
        "differently (default: both, for EAGLE-3 heads)",
    )
    p.add_argument(
        "--dtype",
        default="bfloat16",
        choices=DTYPES,
        help="dtype of the written weights (default: bfloat16, which GPUs serve in; specdec's trained "
        "heads are stored in bfloat16, so nothing is rounded; float32 for heads kept in float32)",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="the folder to write (new, or empty)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow model code from the model's folder or hub")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..drafters import bundled_head, read_head
    from ..drafters.heads.eagle3_loading import is_eagle3_folder, load_eagle3_head
    from ..drafters.heads.eagle_loading import load_head
    from ..drafters.heads.head_export import check_out, export_head
    from ..models.loading import load_model
    from ..models.registry import DEFAULT_MODEL

    out = Path(args.out)
    check_out(out)  # before the model loads: bad input fails in a second
    if args.head is not None and not Path(args.head).is_dir():
        raise ConfigError(f"--head {args.head} is not a folder")
    if args.drafter == "eagle" and args.engine is None:
        raise ConfigError(
            "vLLM and SGLang load EAGLE-1/2 heads differently (fc bias, architecture name): choose "
            "--engine vllm or --engine sglang"
        )
    label = "EAGLE-3" if args.drafter == "eagle3" else "EAGLE"
    model = args.model or DEFAULT_MODEL
    folder = Path(args.head) if args.head else bundled_head(model, args.drafter)
    if folder is None:
        raise ConfigError(
            f"no {label} head is shipped for {model!r}: train one with `specdec train-drafter --kind "
            f"{args.drafter} --model {model} --out DIR` and pass --head DIR"
        )
    if folder.resolve() == out.resolve():
        raise ConfigError(f"--out {out} is the head's own folder; give another")
    eagle3 = is_eagle3_folder(folder)
    if eagle3 != (args.drafter == "eagle3"):
        raise ConfigError(
            f"{folder} holds an EAGLE-3 head: use --drafter eagle3"
            if eagle3
            else f"{folder} holds no EAGLE-3 head (config.json with an Eagle3 architecture): use --drafter "
            f"eagle for EAGLE-1/2 heads"
        )
    target = load_model(model, device="cpu", dtype="float32", backend="torch", trust_remote_code=args.trust_remote_code)
    head = read_head(load_eagle3_head if eagle3 else load_head, folder, target)
    done = export_head(head, target, out, args.engine, args.dtype)
    c = head.config
    what = (
        f"draft vocabulary {c.draft_vocab_size} of {c.vocab_size}, target layers "
        f"{', '.join(map(str, c.feature_layers))}"
        if eagle3
        else f"vocabulary {c.vocab_size}"
    )
    print(f"wrote {out}: {label} head for {target.name} ({what}; {args.dtype}) for {' and '.join(done.engines)}")
    for note in done.notes:
        print(f"note: {note}")
    method = "eagle3" if eagle3 else "eagle"
    for engine in done.engines:
        print(f"serve with {engine}: " + ENGINE_HINTS[engine].format(method=method, algorithm=method.upper(), out=out))
    return 0
