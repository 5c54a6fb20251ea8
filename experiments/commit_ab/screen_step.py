"""One side of an A/B of the screened LM head on smollm2-135m (bfloat16, the kernels): one-token passes after a
300-token prefill, asked for the argmax only (the screen) and for full logits, alternated over 8 rounds of 100.
Prints the checkout and {argmax|full: (median ms, min ms)}.

    PYTHONPATH=CHECKOUT python experiments/commit_ab/screen_step.py CHECKOUT
"""
import sys, time, statistics, torch
sys.path.insert(0, sys.argv[1])
from specdec.models.loading import load_model
t = load_model("smollm2-135m", dtype="bfloat16")
b = t.backend
c = b.new_cache()
b.forward(c, torch.randint(0, 40000, (300,)), last_only=True)
x = torch.tensor([123])
def run(flag):
    b.forward(c, x, argmax_only=flag); b.truncate(c, 300)
for _ in range(30): run(True); run(False)
s = {True: [], False: []}
for r in range(8):
    for flag in ((True, False) if r % 2 == 0 else (False, True)):
        for _ in range(100):
            t0 = time.perf_counter(); run(flag); s[flag].append(time.perf_counter() - t0)
print(sys.argv[1], {("argmax" if k else "full"): (round(statistics.median(v) * 1e3, 3), round(min(v) * 1e3, 3)) for k, v in s.items()})
