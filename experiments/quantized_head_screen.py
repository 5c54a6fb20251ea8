"""How many outputs a screen of a quantized LM head leaves to compute again (docs/experiments/gguf-kernels.md).

A head's codes split as q = 2^s h + l (h the screen's codes, l the s low bits); the screen scores every output from
h with l taken at its centre (2^s - 1) / 2, on the same int8 activations as the exact product, and bounds how far
each screened output can be from the exact one. An output must be computed again when its upper bound reaches the
best lower bound. Three bounds of |sum (l - centre) x| are counted: per group (the centre times each group's |d| and
sum |x|), per output (the largest |d| of the row times sum |x|), and Cauchy-Schwarz (the row's remainder norm times
||x||). Rows are the final hidden states of greedy decoding steps (real prompts for a real model, random ones for a
random-weight shape).

    python experiments/quantized_head_screen.py --model smollm2-135m --prompts ../shared/data/specbench_dev.jsonl
    python experiments/quantized_head_screen.py --model ~/.cache/specdec/shapes/qwen3-0.6b-Q4_K_M-seed0.gguf
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def head_numbers(path: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(codes (N, K / 16, 16) int64, scale (N, K / 16) float64 per 16 weights, code bits) of the file's LM head."""
    from gguf import GGUFReader

    from specdec.models.gguf_blocks import read_q6_k, read_q8_0

    reader = GGUFReader(path)
    names = {t.name: t for t in reader.tensors}
    tensor = names.get("output.weight", names["token_embd.weight"])
    raw = np.asarray(tensor.data).reshape(int(tensor.shape[1]), -1)
    kind = tensor.tensor_type.name
    if kind == "Q8_0":
        rows, bits = read_q8_0(raw), 8
        scale = np.repeat(rows.first.astype(np.float64), 2, axis=1)
    elif kind == "Q6_K":
        rows, bits = read_q6_k(raw), 6
        scale = rows.first.astype(np.float64) * np.repeat(rows.super_d.astype(np.float64), 16, axis=1)
    else:
        raise SystemExit(f"a {kind} head: this counts Q8_0 and Q6_K heads")
    N, K = rows.codes.shape
    return torch.from_numpy(rows.codes.astype(np.int64)).view(N, K // 16, 16), torch.from_numpy(scale), bits


def decoding_rows(model: str, prompts: str | None, limit: int, steps: int, every: int) -> np.ndarray:
    """(P, K) final hidden states of greedy decoding steps: `every`-th of `steps` steps after each prompt."""
    from specdec.models.loading import load_model

    loaded = load_model(model, max_context=2048)
    backend, tokenizer = loaded.backend, loaded.tokenizer
    if prompts:
        texts = [json.loads(line)["turns"][0] for line in open(prompts)][:limit]
        inputs = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": t}], add_generation_prompt=True, return_tensors="pt", return_dict=False
            )[0]
            for t in texts
        ]
    else:
        generator = torch.Generator().manual_seed(0)
        inputs = [torch.randint(0, backend.info.vocab_size, (100,), generator=generator) for _ in range(limit)]
    rows = []
    for ids in inputs:
        cache = backend.new_cache()
        token = int(backend.forward(cache, ids, argmax_only=True).logits[-1].argmax())
        for i in range(steps):
            out = backend.forward(cache, torch.tensor([token]), output_hidden=True)
            if i % every == 0:
                rows.append(out.hidden[-1, : backend.info.hidden_size].float().numpy())
            token = int(out.logits[-1].argmax())
        backend.release(cache)
    return np.stack(rows).astype(np.float32)


def int8_activations(x: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' int8 groups of 32 (int8_lanes.h): codes (P, K / 16, 16) and scale (P, K / 16), per 16."""
    P, K = x.shape
    groups = x.reshape(P, K // 32, 32)
    most = np.abs(groups).max(-1)
    inverse = np.where(most > 0, np.float32(127) / np.where(most > 0, most, 1), 0).astype(np.float32)
    codes = np.rint(groups * inverse[..., None]).astype(np.float64).reshape(P, K // 16, 16)
    scale = np.repeat((most / np.float32(127)).astype(np.float64), 2, axis=1)
    return torch.from_numpy(codes), torch.from_numpy(scale)


def candidates(q, scale, c, s, low_bits: int, chunk: int = 4) -> dict[str, list[int]]:
    """Outputs each bound leaves per row, for a screen that drops the low_bits low bits of the codes."""
    centre = (2**low_bits - 1) / 2
    h = (q >> low_bits) * 2**low_bits + centre
    rest = (q & (2**low_bits - 1)) - centre
    rest_norm = ((scale[:, :, None] * rest) ** 2).sum((1, 2)).sqrt()
    most_scale = scale.abs().max(1).values
    qf, hf = q.double(), h.double()
    counts: dict[str, list[int]] = {"per group": [], "per output": [], "cauchy-schwarz": []}
    for p0 in range(0, c.shape[0], chunk):
        cc, ss = c[p0 : p0 + chunk], s[p0 : p0 + chunk]
        weights = scale[:, None] * ss[None]  # (N, p, K / 16)
        exact = (torch.einsum("nhk,phk->nph", qf, cc) * weights).sum(-1)
        screen = (torch.einsum("nhk,phk->nph", hf, cc) * weights).sum(-1)
        magnitude = cc.abs().sum(-1)  # (p, K / 16)
        bounds = {
            "per group": centre * (weights.abs() * magnitude[None]).sum(-1),
            "per output": centre * most_scale[:, None] * (ss * magnitude).sum(-1)[None],
            "cauchy-schwarz": rest_norm[:, None] * ((cc * ss[..., None]) ** 2).sum((1, 2)).sqrt()[None],
        }
        assert bool(((exact - screen).abs() <= bounds["per group"] * (1 + 1e-9)).all())
        for name, bound in bounds.items():
            floor = (screen - bound).max(0).values
            counts[name] += (screen + bound >= floor[None]).sum(0).tolist()
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a built-in alias or a .gguf file")
    parser.add_argument("--prompts", help="a Spec-Bench jsonl (random prompts if absent)")
    parser.add_argument("--limit", type=int, default=26)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--out-json")
    args = parser.parse_args()
    from specdec.models.fetch import ensure_gguf
    from specdec.models.registry import KNOWN_MODELS

    path = ensure_gguf(args.model) if args.model in KNOWN_MODELS else Path(args.model).expanduser()
    q, scale, bits = head_numbers(str(path))
    c, s = int8_activations(decoding_rows(args.model, args.prompts, args.limit, args.steps, args.every))
    report = {"model": args.model, "head_bits": bits, "rows": int(c.shape[0]), "outputs": int(q.shape[0])}
    for screen_bits in range(4, bits):
        counts = candidates(q, scale, c, s, bits - screen_bits)
        report[f"screen_{screen_bits}_bits"] = {
            name: {
                "median": float(np.median(v)),
                "mean": float(np.mean(v)),
                "p90": float(np.percentile(v, 90)),
                "max": int(np.max(v)),
            }
            for name, v in counts.items()
        }
        print(screen_bits, json.dumps(report[f"screen_{screen_bits}_bits"]), flush=True)
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
