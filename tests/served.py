"""The OpenAI-API tests' shared server (conftest's openai_server): its API key, its Prometheus metrics, and prompts
of the tiny model's words."""
import re

import httpx

from tiny import WORDS

KEY = "sk-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def metric(server, name: str) -> float:
    """The sum of the samples of metric `name` (labels included, as in `x{le="1.0"}`) that /metrics shows now."""
    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)} (\S+)$", text, re.M))


def prompt(i: int, n: int = 6) -> str:
    """The i-th of a family of different prompts of n + i % 5 words."""
    return " ".join(WORDS[(7 * i + 3 * j) % len(WORDS)] for j in range(n + i % 5))
