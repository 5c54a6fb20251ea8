"""The quantized drafter on the Qwen3-0.6B shape (random weights, bfloat16, the kernels): it drafts, and speculative
output equals plain decoding. Acceptance on random weights means nothing and is not reported as a figure."""
import json
import torch
from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters import create_drafter
from specdec.engine import SpecDecoder
from specdec.models.shapes import load_shape

shape = load_shape("qwen3-0.6b", device="cpu", dtype="bfloat16")
target = shape.loaded
plain = SpecDecoder(target, None)
spec = SpecDecoder(target, create_drafter("quantized", target), SpeculationConfig(num_speculative_tokens=4, adaptive=False))
torch.manual_seed(0)
config = GenerationConfig(max_new_tokens=32, ignore_eos=True)
out = []
for i in range(2):
    prompt = torch.randint(0, 150000, (60,)).tolist()
    prompt = prompt + prompt  # something prompt lookup can find
    want, _ = plain.generate_ids(prompt, config)
    got, m = spec.generate_ids(prompt, config)
    out.append({"equal_to_plain": got == want, "drafted": m.drafted_tokens, "backend": type(target.backend).__name__})
print(json.dumps(out))
