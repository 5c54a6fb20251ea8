"""How often a quantized copy of the target picks the target's own next token: teacher-forced agreement on the
target's greedy answers to Spec-Bench prompts, for several ways of quantizing (weights rounded to their groups and
back, in float32, with transformers' forward: the numbers, not the speed).

The rows tell what the quantized drafter (`--drafter quantized`: 4-bit groups of 32 for the layers, 8-bit for the LM
head, int8 activations) can expect: on weights that are 4-bit groups already (the built-in smollm2-135m, from a Q4_1
GGUF) the 4-bit rounding reproduces them, while "off the grid" (groups of 64, or symmetric 4-bit) shows what
rounding a model trained in bfloat16 would cost. `--skip-layers` adds rows for the target with some of its layers
left out (unrounded): what a self-speculative drafter that skips layers (Draft & Verify, SWIFT) could expect.

    python experiments/quantized_agreement.py --prompts ../shared/data/specbench_dev.jsonl --per-category 2 \\
        --out-json experiments/results/quantized_agreement_f32.json [--skip-layers "15;14,15;12,14,16"]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (name, layer bits, layer group, asymmetric, LM head bits or None, int8 activations)
SCHEMES = [
    ("8-bit per row, layers only", 8, 0, False, None, False),
    ("4-bit groups of 32 (Q4_1), layers only", 4, 32, True, None, False),
    ("Q4_1 layers, 8-bit LM head, int8 activations (the quantized drafter)", 4, 32, True, 8, True),
    ("Q4_1 layers, 4-bit LM head", 4, 32, True, 4, False),
    ("4-bit groups of 64 (off the grid), layers only", 4, 64, True, None, False),
    ("symmetric 4-bit groups of 32 (off the grid), layers only", 4, 32, False, None, False),
]


def rounded(w: torch.Tensor, bits: int, group: int, asymmetric: bool) -> torch.Tensor:
    """w (N, K) rounded to `bits` in groups of `group` along K (0: a whole row) and back, with float16 scales."""
    N, K = w.shape
    g = w.view(N, K // (group or K), group or K)
    if asymmetric:
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        m, d = lo.half().float(), ((hi - lo) / (2 ** bits - 1)).half().float()
        u = torch.where(d > 0, ((g - m) / d.clamp_min(1e-30)).round().clamp(0, 2 ** bits - 1), 0)
        return (u * d + m).view(N, K)
    top = 2 ** (bits - 1) - 1
    d = (g.abs().amax(-1, keepdim=True) / top).half().float()
    return (torch.where(d > 0, (g / d.clamp_min(1e-30)).round().clamp(-top, top), 0) * d).view(N, K)


def int8_activations(x: torch.Tensor) -> torch.Tensor:
    """x rounded to int8 per group of 32 of its last dimension (scale max|x| / 127) and back."""
    g = x.reshape(-1, 32)
    d = g.abs().amax(-1, keepdim=True) / 127
    return (torch.where(d > 0, (g / d.clamp_min(1e-30)).round(), 0) * d).view(x.shape)


def answers(hf, tokenizer, rows: list[dict], new_tokens: int) -> list[tuple[str, torch.Tensor, int]]:
    """(category, prompt + the target's greedy answer (T,), prompt length) for each row's first turn."""
    out = []
    for row in rows:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": row["turns"][0]}],
                                            add_generation_prompt=True, return_tensors="pt")
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
        full = hf.generate(ids, max_new_tokens=new_tokens, do_sample=False)[0]
        out.append((row["category"], full, ids.shape[1]))
    return out


def agreement(hf, sequences) -> dict:
    """Share of answer positions where the model's argmax is the answer's next token, overall and by category."""
    hits, counts = {}, {}
    with torch.no_grad():
        for category, seq, prompt_len in sequences:
            pred = hf(seq[None], use_cache=False).logits[0, prompt_len - 1:-1].argmax(-1)
            hits[category] = hits.get(category, 0) + int((pred == seq[prompt_len:]).sum())
            counts[category] = counts.get(category, 0) + seq.numel() - prompt_len
    return {"all": sum(hits.values()) / sum(counts.values()),
            "by_category": {c: hits[c] / counts[c] for c in sorted(counts)}, "positions": sum(counts.values())}


def main() -> None:
    from specdec.models.loading import load_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--out-json", required=True)
    ap.add_argument("--skip-layers", default="", help="groups of layer indices separated by ';', each group a row "
                    "of the target without those layers")
    args = ap.parse_args()

    target = load_model(args.model, dtype="float32", backend="hf")
    hf = target.hf_model
    rows, seen = [], {}
    for line in Path(args.prompts).read_text().splitlines():
        row = json.loads(line)
        if seen.get(row["category"], 0) < args.per_category:
            seen[row["category"]] = seen.get(row["category"], 0) + 1
            rows.append(row)
    sequences = answers(hf, target.tokenizer, rows, args.max_new_tokens)
    if hf.lm_head.weight is hf.model.embed_tokens.weight:  # the drafter rounds the LM head, not the embeddings
        hf.lm_head.weight = torch.nn.Parameter(hf.lm_head.weight.detach().clone())
    original = {k: v.clone() for k, v in hf.state_dict().items()}
    results = []
    for name, bits, group, asym, head_bits, act8 in SCHEMES:
        state = dict(original)
        for key, w in original.items():
            if w.dim() == 2 and "layers." in key:
                state[key] = rounded(w, bits, group, asym)
            elif head_bits and key == "lm_head.weight":
                state[key] = rounded(w, head_bits, 32, head_bits == 4)
        hf.load_state_dict(state)
        hooks = [mod.register_forward_pre_hook(lambda mod, inp: (int8_activations(inp[0]),))
                 for mod in hf.modules() if act8 and isinstance(mod, torch.nn.Linear)]
        results.append({"scheme": name, **agreement(hf, sequences)})
        for hook in hooks:
            hook.remove()
        print(f"{results[-1]['all']:.4f}  {name}", flush=True)
    hf.load_state_dict(original)
    layers = hf.model.layers
    for group in filter(None, args.skip_layers.split(";")):
        skipped = sorted({int(i) for i in group.split(",")})
        hf.model.layers = torch.nn.ModuleList([m for i, m in enumerate(layers) if i not in skipped])
        results.append({"scheme": f"layers {skipped} skipped", **agreement(hf, sequences)})
        print(f"{results[-1]['all']:.4f}  {results[-1]['scheme']}", flush=True)
    hf.model.layers = layers
    Path(args.out_json).write_text(json.dumps({"model": args.model, "prompts": len(rows),
                                               "max_new_tokens": args.max_new_tokens, "results": results}, indent=1))


if __name__ == "__main__":
    main()
