"""The real default model behind the server: greedy chat output equals the stored golden text (float32),
for two requests decoded in one batch."""
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from specdec.benchmarks.server_process import ServerProcess  # noqa: E402

GOLDEN = json.loads((Path(__file__).parent / "golden" / "smollm2-135m.json").read_text())

pytestmark = pytest.mark.slow


def test_real_model_served_in_a_batch_gives_the_golden_text():
    args = ["--model", GOLDEN["model"], "--dtype", GOLDEN["dtype"], "--max-batch", "2", "--dequantize"]
    with ServerProcess(args) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        request = dict(model=GOLDEN["model"], messages=[{"role": "user", "content": GOLDEN["prompt"]}],
                       max_tokens=GOLDEN["max_new_tokens"], temperature=0)

        def streamed():
            chunks = client.chat.completions.create(stream=True, **request)
            return "".join(c.choices[0].delta.content or "" for c in chunks)

        with ThreadPoolExecutor(2) as pool:
            plain = pool.submit(lambda: client.chat.completions.create(**request))
            text = pool.submit(streamed)
            response, text = plain.result(), text.result()
    assert response.choices[0].message.content == text == GOLDEN["text"]
    assert response.usage.completion_tokens == len(GOLDEN["token_ids"])
