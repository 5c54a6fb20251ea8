import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
# pytest-xdist runs the tests in parallel workers (pyproject.toml): the cores are shared out among them.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, torch.get_num_threads() // _workers)))


@pytest.fixture(scope="session", autouse=True)
def gguf_index_of_the_session(tmp_path_factory):
    """GGUF loads keep what they parsed (models/gguf_index.py) in the session's own folder, not the user's cache:
    a test's load parses its file unless an earlier load in the same worker did."""
    from specdec.models import gguf_index

    root = tmp_path_factory.mktemp("gguf-index")
    original = gguf_index.index_root
    gguf_index.index_root = lambda: root
    yield root
    gguf_index.index_root = original


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory) -> Path:
    """A local transformers model folder (random weights, word-level tokenizer)."""
    from tiny import write_tiny_model_folder

    return write_tiny_model_folder(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def tiny_draft_folder(tmp_path_factory) -> Path:
    """Another random model with the same tokenizer."""
    from tiny import write_tiny_model_folder

    return write_tiny_model_folder(tmp_path_factory.mktemp("tiny") / "draft", seed=1, hidden=16)


@pytest.fixture(scope="session")
def other_vocab_folder(tmp_path_factory) -> Path:
    """A random model whose tokenizer differs from tiny_folder's."""
    from tiny import WORDS, write_tiny_model_folder

    return write_tiny_model_folder(tmp_path_factory.mktemp("tiny") / "other", seed=2, words=list(reversed(WORDS)))


@pytest.fixture(scope="session")
def tiny_bpe_folder(tmp_path_factory) -> Path:
    """A local model folder with a byte-level BPE tokenizer (for structured output)."""
    from tiny import write_tiny_bpe_folder

    return write_tiny_bpe_folder(tmp_path_factory.mktemp("tiny") / "bpe", seed=0)


@pytest.fixture(scope="module")
def eagle_target():
    """A random tiny Llama (hidden 64: 4 heads of dim 16, 2 KV heads; 2 layers) whose shapes the CPU kernels and an
    EAGLE head's kernel products take."""
    from tiny import tiny_llama

    return tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)


@pytest.fixture(scope="module")
def eagle3_target():
    """eagle_target's shapes with 8 layers: an EAGLE-3 head reads the inputs of three of them (eagle3_heads.LAYERS)."""
    from tiny import tiny_llama

    return tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2, layers=8)


@pytest.fixture(scope="module")
def tiny_target(tiny_folder):
    """tiny_folder's model loaded in float32 (its default backend)."""
    from specdec.models.loading import load_model

    return load_model(str(tiny_folder), dtype="float32")


@pytest.fixture(scope="session")
def served_folder(tmp_path_factory) -> Path:
    """The model the OpenAI-API tests serve: hidden size 64, shapes the CPU kernels take, whose float32 forward is
    batch-invariant (a sequence decoded in a batch equals it decoded alone)."""
    from tiny import write_tiny_model_folder

    return write_tiny_model_folder(tmp_path_factory.mktemp("serve") / "tiny64", seed=0, hidden=64)


@pytest.fixture(scope="session")
def openai_server(served_folder):
    """`specdec serve` of served_folder in its own process, named "tiny", up to 16 sequences a step, its API key
    (served.KEY) taken from the environment. One for the session: the tests read its metrics as differences."""
    from served import KEY
    from specdec.benchmarks.server_process import ServerProcess

    args = ["--model", str(served_folder), "--dtype", "float32", "--threads", "1", "--served-model-name", "tiny",
            "--max-batch", "16"]
    with ServerProcess(args, env={"SPECDEC_API_KEY": KEY}) as s:
        yield s


@pytest.fixture(scope="session")
def openai_client(openai_server):
    """The official openai client of openai_server (no retries: a failed request fails the test)."""
    import openai
    from served import KEY

    return openai.OpenAI(base_url=openai_server.url + "/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="session")
def local_decoders(served_folder):
    """(chat, raw): the engine in this process on the served model, with and without the chat template; what the
    server answers is compared with what these give for the same request."""
    from specdec.engine import SpecDecoder
    from specdec.models.loading import load_model

    target = load_model(str(served_folder), dtype="float32")
    return SpecDecoder(target, None), SpecDecoder(target, None, chat=False)


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    """The CPU the tests ran on, in a line after the results (the kernels' tests run different code on AVX2,
    AVX-512, VNNI, BF16 and AMX): a failure on a machine nobody else has is then told by its report."""
    from specdec import kernels

    flags = kernels.cpu_flags()
    extras = [f for f in ("avx512_vnni", "avx512_bf16", "amx_tile") if f in flags]
    overrides = [f"{name}={os.environ[name]}" for name in (kernels.ISA_VARIABLE, kernels.PREFILL_VARIABLE)
                 if os.environ.get(name)]
    terminalreporter.write_line(f"specdec kernels: the {kernels.cpu_instruction_set()} build "
                                f"({', '.join(extras) or 'no VNNI, BF16 or AMX'}), {os.cpu_count()} CPUs"
                                + (f"; {', '.join(overrides)}" if overrides else ""))
