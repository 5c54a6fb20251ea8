"""specdec:none alone on the 26 floor prompts (as `specdec bench` builds it): tokens/s and an output hash."""
import hashlib, json, sys
from specdec.benchmarks.prompts import load_prompts
from specdec.benchmarks.runner import SpecdecMethod, run_methods
from specdec.speculation_config import SpeculationConfig
from specdec.engine import SpecDecoder
from specdec.models.loading import load_model
prompts = load_prompts(sys.argv[1], limit=26)
target = load_model("smollm2-135m", dtype="bfloat16")
probe = SpecDecoder(target, None)
encoded = [(p, probe.encode(p.text)) for p in prompts]
r = run_methods([SpecdecMethod("none", SpecDecoder(target, None, SpeculationConfig()))], encoded, 128, progress=False)["none"]
tokens = sum(len(x.tokens) for x in r.runs.values()); seconds = sum(x.seconds for x in r.runs.values())
decode = sum(x.metrics.total_time_s - x.metrics.prefill_time_s for x in r.runs.values())
prefill = sum(x.metrics.prefill_time_s for x in r.runs.values())
print(json.dumps({"tok_s": round(tokens / seconds, 2), "prefill_s": round(prefill, 2), "decode_s": round(decode, 2),
                  "outputs": hashlib.sha256(json.dumps([r.runs[p.question_id].tokens for p, _ in encoded]).encode()).hexdigest()[:12]}))
