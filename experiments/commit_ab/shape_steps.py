"""One side of an A/B of the kernels on a random-weight shape (default qwen3-0.6b, bfloat16): a 125-token prompt, then
one-token greedy steps as plain decoding runs them (argmax_only), several rounds. Prints a JSON line: the steps'
median and minimum ms, the prompt pass's median ms, and a hash of the tokens (the same on both sides, or the change
is not a speed change only).

    python experiments/commit_ab/shape_steps.py [shape] [rounds] [steps]
"""
import hashlib
import json
import statistics
import sys
import time

import torch

from specdec.models.shapes import load_shape

name = sys.argv[1] if len(sys.argv) > 1 else "qwen3-0.6b"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 48
backend = load_shape(name, "cpu", "bfloat16", "kernels", max_context=1024).loaded.backend
prompt = torch.randint(0, backend.info.vocab_size, (125,), generator=torch.Generator().manual_seed(0))
step_s, prefill_s, made = [], [], []
for _ in range(rounds):
    cache = backend.new_cache()
    start = time.perf_counter()
    token = int(backend.forward(cache, prompt, last_only=True, argmax_only=True).logits[-1].argmax())
    prefill_s.append(time.perf_counter() - start)
    tokens = [token]
    for _ in range(steps):
        start = time.perf_counter()
        token = int(backend.forward(cache, torch.tensor([token]), argmax_only=True).logits[-1].argmax())
        step_s.append(time.perf_counter() - start)
        tokens.append(token)
    made.append(tokens)
    backend.release(cache)
print(json.dumps({"step_median_ms": round(statistics.median(step_s) * 1e3, 3),
                  "step_min_ms": round(min(step_s) * 1e3, 3),
                  "prefill_median_ms": round(statistics.median(prefill_s) * 1e3, 1),
                  "tokens": hashlib.sha256(json.dumps(made).encode()).hexdigest()[:12]}))
