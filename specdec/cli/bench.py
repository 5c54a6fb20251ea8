"""`specdec bench`: speed and equality against transformers on Spec-Bench style prompts."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from ..config import DTYPES
from .common import add_graphs_option, check_minimums, require_extra
from .drafting_options import (
    add_acceptance_option,
    add_lookahead_options,
    add_tree_options,
    draft_p_min,
    lookahead_options,
)


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmark specdec against transformers (greedy, same process)")
    p.add_argument("--prompts", required=True, help="Spec-Bench JSONL (question_id, category, turns)")
    p.add_argument("--limit", type=int, default=None, help="number of prompts, picked round-robin across categories")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--model", default=None, help="target model (default: smollm2-135m)")
    p.add_argument("--dtype", default="auto", choices=DTYPES)
    p.add_argument(
        "--dequantize",
        action="store_true",
        help="run a GGUF file's quantized weights as floats in --dtype (default: in the file's formats)",
    )
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--drafters",
        default=None,
        help="comma-separated specdec drafters (default: ngram, suffix, plus eagle and "
        "medusa when heads are known for the model, plus draft-model when "
        "--draft-model is given); eagle-chain and medusa-chain draft chains",
    )
    p.add_argument("--eagle-head", default=None, help="folder of a trained EAGLE head")
    p.add_argument("--medusa-head", default=None, help="folder of Medusa heads")
    p.add_argument("--layerskip-layers", type=int, default=None, help="exit layer of the layerskip drafter")
    p.add_argument(
        "--select-from",
        default=None,
        help="comma-separated candidates of the select drafter (default: "
        "eagle, medusa, ngram, suffix, those available)",
    )
    p.add_argument("--draft-model", default=None, help="draft model for draft-model and hf_assisted")
    p.add_argument(
        "--draft-p-min",
        type=draft_p_min,
        default=0.0,
        metavar="P",
        help="draft-model, layerskip and quantized stop drafting after a token they give a probability below P "
        "(default: 0, off)",
    )
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=8)
    add_tree_options(p)
    add_lookahead_options(p)
    p.add_argument("--no-adaptive", action="store_true")
    add_acceptance_option(p, sweep=True)
    p.add_argument(
        "--no-hf", action="store_true", help="skip transformers' speculative methods (hf_generate always runs)"
    )
    p.add_argument("--hf-prompt-lookup-tokens", type=int, default=10, help="transformers' prompt_lookup_num_tokens")
    p.add_argument(
        "--backends",
        default="auto",
        help="comma-separated specdec backends to compare (auto, kernels, "
        "kernels-bf16, kernels-bf16kv, torch, hf); methods on the second "
        "and later ones are named specdec@BACKEND:DRAFTER",
    )
    add_graphs_option(p)
    p.add_argument(
        "--reference-dtype",
        default=None,
        choices=[d for d in DTYPES if d != "auto"],
        help="also decode each prompt greedily with transformers in this dtype (untimed) and count, per "
        "method, the prompts identical to it (identical_to_reference)",
    )
    p.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        help="every method decodes greedily with this repetition penalty (transformers'; default: 1, off)",
    )
    p.add_argument(
        "--llama-cpp",
        default=None,
        metavar="DIR",
        help="folder of built llama.cpp tools: adds native llama.cpp as reference methods llamacpp "
        "(llama-completion) and llamacpp_lookup (llama-lookup, drafting up to -k tokens), on the "
        "built-in model's GGUF file, with as many threads as torch uses",
    )
    p.add_argument("--out-json", default=None, help="write the results JSON here")
    p.add_argument("--report", default=None, help="write summary.md and speedup.png into this folder")
    p.add_argument("--trust-remote-code", action="store_true")
    p.set_defaults(run=run)


def weights_format(target) -> str:
    """How the target's weights run: "gguf: TYPE, TYPE..." for a GGUF file kept in its own formats, else "float"."""
    if not target.backend.quantized_weights:
        return "float"
    return "gguf: " + ", ".join(target.backend.weight_types)


def run(args) -> int:
    import torch

    from ..costs import CostModel, measure_verify_costs
    from ..config import GenerationConfig
    from ..speculation_config import SpeculationConfig
    from ..drafters import bundled_head, create_drafter
    from ..engine import SpecDecoder
    from ..errors import ConfigError
    from ..models.backend_choice import make_backend
    from ..models.loading import LoadedModel, load_model
    from ..models.registry import DEFAULT_MODEL
    from ..benchmarks import llamacpp
    from ..benchmarks.prompts import load_prompts
    from ..benchmarks.report import table, write_report
    from ..benchmarks.runner import (
        HFMethod,
        SpecdecMethod,
        machine_info,
        reference_tokens,
        run_methods,
        stamp,
        summarize,
    )
    from ..benchmarks.tradeoff import method_name

    if args.max_new_tokens < 1:
        raise ConfigError("--max-new-tokens must be >= 1")
    if args.report:  # before the run, not after it
        require_extra("matplotlib", "bench", "--report")
    check_minimums(args, {"tree_width": 1, "tree_nodes": 1})
    lookahead = lookahead_options(args)  # refused before anything loads
    if args.llama_cpp:  # a missing tool or model is refused before anything loads
        if args.repetition_penalty != 1.0:
            raise ConfigError("--llama-cpp compares plain greedy decoding only: leave --repetition-penalty at 1")
        llama_gguf = llamacpp.setup(args.llama_cpp, args.model or DEFAULT_MODEL)
    speculation = SpeculationConfig(num_speculative_tokens=args.num_speculative_tokens, adaptive=not args.no_adaptive)
    GenerationConfig.create(repetition_penalty=args.repetition_penalty)  # refuses a bad value before loading
    penalty = args.repetition_penalty
    hf_kwargs = {"repetition_penalty": penalty} if penalty != 1.0 else {}
    prompts = load_prompts(args.prompts, args.limit)
    model_name = args.model or DEFAULT_MODEL
    default = (
        ["ngram", "suffix"]
        + (["eagle"] if args.eagle_head or bundled_head(model_name) else [])
        + (["eagle3"] if bundled_head(model_name, "eagle3") else [])
        + (["medusa"] if args.medusa_head or bundled_head(model_name, "medusa") else [])
        + (["draft-model"] if args.draft_model else [])
    )
    drafters = [d for d in (args.drafters.split(",") if args.drafters else default) if d and d != "none"]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()] or ["auto"]
    target = load_model(
        model_name,
        device=args.device,
        dtype=args.dtype,
        trust_remote_code=args.trust_remote_code,
        backend=backends[0],
        graphs=args.graphs,
        compile=args.compile,
        dequantize=args.dequantize,
    )
    draft = None
    if args.draft_model:
        draft = load_model(
            args.draft_model,
            device=args.device,
            dtype=str(target.info.dtype).replace("torch.", ""),
            trust_remote_code=args.trust_remote_code,
        )
    decoder_probe = SpecDecoder(target, None)
    encoded = [(p, decoder_probe.encode(p.text)) for p in prompts]
    quantized = target.backend.quantized_weights
    if quantized and len(backends) > 1:
        raise ConfigError(
            "--backends compares float backends: a GGUF file in its own formats runs on the kernels "
            "only (add --dequantize to compare backends on its dequantized weights)"
        )
    # transformers runs a quantized file's weights dequantized (its only way): a second, float copy of the model
    hf_target = (
        load_model(model_name, device="cpu", dtype=args.dtype, backend="hf", dequantize=True) if quantized else target
    )

    methods: list[HFMethod | SpecdecMethod | llamacpp.LlamaCppMethod] = [
        HFMethod("hf_generate", hf_target.hf_model, **hf_kwargs)
    ]
    if not args.no_hf:
        methods.append(
            HFMethod(
                "hf_prompt_lookup",
                hf_target.hf_model,
                prompt_lookup_num_tokens=args.hf_prompt_lookup_tokens,
                **hf_kwargs,
            )
        )
        if draft is not None:
            methods.append(HFMethod("hf_assisted", hf_target.hf_model, assistant_model=draft.hf_model, **hf_kwargs))
    for i, backend_name in enumerate(backends):
        backend = target.backend if i == 0 else make_backend(target.hf_model, target.info, backend_name)
        view = LoadedModel(name=target.name, hf_model=target.hf_model, tokenizer=target.tokenizer, backend=backend)
        prefix = "specdec" if i == 0 else f"specdec@{backend_name}"
        costs = CostModel(measure_verify_costs(backend))
        methods.append(SpecdecMethod(f"{prefix}:none", SpecDecoder(view, None, speculation), penalty))
        for name, rule in [(name, rule) for name in drafters for rule in args.acceptance]:
            kind = name.removesuffix("-chain")
            drafter = create_drafter(
                kind,
                view,
                draft_model=draft,
                eagle_head=args.eagle_head,
                medusa_head=args.medusa_head,
                tree=not name.endswith("-chain"),
                layerskip_layers=args.layerskip_layers,
                select_from=args.select_from,
                draft_p_min=args.draft_p_min,
                tree_width=args.tree_width,
                tree_nodes=args.tree_nodes,
                calibrate_trees=args.calibrate_trees,
                **lookahead,
            )
            # each drafter learns its own drafting cost; the measured verify curve is shared
            decoder = SpecDecoder(view, drafter, replace(speculation, acceptance=rule), costs=CostModel(costs.table))
            decoder.warm_up()
            methods.append(SpecdecMethod(method_name(prefix, name, rule), decoder, penalty))
        if i == 0:
            first_costs, first_backend = costs, type(backend).__name__

    if args.llama_cpp:
        methods += llamacpp.methods(
            args.llama_cpp,
            llama_gguf,
            target.tokenizer,
            target.info.eos_token_ids,
            threads=torch.get_num_threads(),
            draft_max=args.num_speculative_tokens,
        )
    results = run_methods(methods, encoded, args.max_new_tokens)
    reference = None
    if args.reference_dtype:
        ref_model = load_model(model_name, device=args.device, dtype=args.reference_dtype, backend="hf")
        reference = reference_tokens(ref_model.hf_model, encoded, args.max_new_tokens, **hf_kwargs)
        del ref_model
    meta = {
        **stamp(),
        "model": model_name,
        "dtype": str(target.info.dtype).replace("torch.", ""),
        "device": str(target.info.device),
        "weights": weights_format(target),
        "max_new_tokens": args.max_new_tokens,
        "prompt_file": str(args.prompts),
        "num_speculative_tokens": args.num_speculative_tokens,
        "adaptive": not args.no_adaptive,
        "tree_width": args.tree_width,
        "tree_nodes": args.tree_nodes,
        "calibrate_trees": args.calibrate_trees,
        **lookahead,
        "specdec_backend": first_backend,
        "verify_costs_s": first_costs.table,
        "machine": machine_info(),
        "reference_dtype": args.reference_dtype,
        "repetition_penalty": penalty,
        "acceptance": args.acceptance,
    }
    if args.llama_cpp:
        meta["llama_cpp"] = llamacpp.describe(
            args.llama_cpp, llama_gguf, threads=torch.get_num_threads(), draft_max=args.num_speculative_tokens
        )
    summary = summarize(
        results, encoded, hf_target.hf_model, meta, reference, plain_of=llamacpp.PLAIN_OF if args.llama_cpp else None
    )
    print(table(summary))
    if args.out_json:
        Path(args.out_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out_json).write_text(json.dumps(summary, indent=2), encoding="utf-8")
        print(f"wrote {args.out_json}", file=sys.stderr)
    if args.report:
        for path in write_report(summary, args.report):
            print(f"wrote {path}", file=sys.stderr)
    return 0
