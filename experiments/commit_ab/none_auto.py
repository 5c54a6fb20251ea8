"""One side of an A/B run of the floor prompts without transformers' baseline: specdec:none and specdec:auto,
built exactly as `specdec bench` builds them, interleaved prompt by prompt (bench.runner.run_methods). Prints a JSON
line: per method tokens/s, MAT, and a hash of every output."""
import hashlib
import json
import sys

from specdec.benchmarks.prompts import load_prompts
from specdec.benchmarks.runner import SpecdecMethod, run_methods
from specdec.speculation_config import SpeculationConfig
from specdec.costs import CostModel, measure_verify_costs
from specdec.drafters import create_drafter
from specdec.engine import SpecDecoder
from specdec.models.loading import load_model

prompts = load_prompts(sys.argv[1], limit=26)
target = load_model("smollm2-135m", dtype="bfloat16")
speculation = SpeculationConfig()
probe = SpecDecoder(target, None)
encoded = [(p, probe.encode(p.text)) for p in prompts]
costs = CostModel(measure_verify_costs(target.backend))
methods = [SpecdecMethod("none", SpecDecoder(target, None, speculation))]
auto = SpecDecoder(target, create_drafter("auto", target), speculation, costs=CostModel(costs.table))
auto.warm_up()
methods.append(SpecdecMethod("auto", auto))
results = run_methods(methods, encoded, 128, progress=False)
out = {}
for name, r in results.items():
    tokens = sum(len(run.tokens) for run in r.runs.values())
    seconds = sum(run.seconds for run in r.runs.values())
    steps = sum(run.metrics.steps for run in r.runs.values())
    step_tokens = sum(run.metrics.step_tokens for run in r.runs.values())
    digest = hashlib.sha256(json.dumps([r.runs[p.question_id].tokens for p, _ in encoded]).encode()).hexdigest()[:12]
    out[name] = {"tok_s": round(tokens / seconds, 2), "tokens": tokens, "seconds": round(seconds, 2),
                 "mat": round(step_tokens / max(steps, 1), 3), "outputs": digest}
print(json.dumps(out))
