"""Wall time of `load_model` for GGUF files under two checkouts (A, B: their repository roots), one fresh process
a load, the checkouts alternated; each child imports specdec from its checkout and times only the load (its
imports apart). The kernels must already be built for both (a first load builds them).

    A=/tmp/old B=. python experiments/load_time_ab.py ROUNDS OUT.json FILE_OR_ALIAS...
"""

import json
import os
import subprocess
import sys
import time

CHILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
t0 = time.perf_counter()
from specdec.models.loading import load_model
t1 = time.perf_counter()
load_model(sys.argv[2])
print(f"{t1 - t0:.3f} {time.perf_counter() - t1:.3f}")
"""


def main(rounds: int, out: str, models: list[str]) -> None:
    trees = {"A": os.path.abspath(os.environ["A"]), "B": os.path.abspath(os.environ["B"])}
    results: dict = {"trees": trees, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loads": {}}
    for model in models:
        runs: dict = {"A": [], "B": []}
        for r in range(rounds):
            for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
                done = subprocess.run([sys.executable, "-c", CHILD, trees[name], model], capture_output=True,
                                      text=True, cwd="/", check=True)
                imports, load = map(float, done.stdout.split()[-2:])
                runs[name].append({"import_s": imports, "load_s": load})
        results["loads"][model] = runs
        print(model, {k: [x["load_s"] for x in v] for k, v in runs.items()}, flush=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3:])
