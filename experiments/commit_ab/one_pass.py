import statistics, sys, time, json
import torch
from specdec.models.loading import load_model
t = load_model("smollm2-135m", dtype="bfloat16")
b = t.backend
c = b.new_cache()
torch.manual_seed(0)
ids = torch.randint(0, 40000, (300,))
b.forward(c, ids, last_only=True)
times = {}
for T in (1, 5):
    x = torch.randint(0, 40000, (T,))
    samples = []
    for i in range(120):
        t0 = time.perf_counter(); b.forward(c, x); samples.append(time.perf_counter() - t0); b.truncate(c, 300)
    times[T] = round(statistics.median(samples[20:]) * 1e3, 3)
print(json.dumps(times))
