"""The built-in alias runs its own GGUF file (Q4_1) as it is where the CPU kernels run, as `--model FILE.gguf` does;
`dequantize` gives its float conversion; and `auto` over it is prompt lookup, exactly lossless."""
import pytest

from specdec.config import GenerationConfig
from specdec.engine import SpecDecoder
from specdec.models.loading import load_model

kernels = pytest.importorskip("specdec.kernels")
if kernels.unavailable_reason():
    pytest.skip(kernels.unavailable_reason(), allow_module_level=True)

pytestmark = pytest.mark.slow
ALIAS = "smollm2-135m"
PROMPT = "List the days of the week, then list them again in reverse order."


@pytest.fixture(scope="module")
def target():
    return load_model(ALIAS)


def test_the_alias_runs_its_files_quantized_matrices(target):
    assert type(target.backend).__name__ == "KernelLlama"
    assert target.backend.quantized_weights and "Q4_1" in target.backend.weight_types
    assert target.name == ALIAS  # the name its shipped heads are found by


def test_the_alias_decodes_as_its_file_given_by_path(target):
    from specdec.models.fetch import ensure_gguf

    by_path = load_model(str(ensure_gguf(ALIAS)))
    config = GenerationConfig(max_new_tokens=24)
    assert SpecDecoder(target, None).generate(PROMPT, config).token_ids == (
        SpecDecoder(by_path, None).generate(PROMPT, config).token_ids)


def test_dequantize_gives_the_float_conversion():
    floats = load_model(ALIAS, dtype="float32", dequantize=True)
    assert not getattr(floats.backend, "quantized_weights", False)


def test_auto_over_the_alias_is_prompt_lookup_and_lossless(target):
    from specdec.drafters import create_drafter
    from specdec.drafters.routing.auto import auto_drafter_name

    assert auto_drafter_name(target, {}) == "ngram"  # the 4-bit copy would cost what the 4-bit target costs
    config = GenerationConfig(max_new_tokens=48)
    plain = SpecDecoder(target, None).generate(PROMPT, config)
    speculative = SpecDecoder(target, create_drafter("ngram", target)).generate(PROMPT, config)
    assert speculative.token_ids == plain.token_ids
