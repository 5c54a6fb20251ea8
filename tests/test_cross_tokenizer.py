"""A draft model with another tokenizer drafts through text (universal assisted decoding): the output is the
target's, greedy and seed-stable sampled, and a draft that predicts the target well is accepted across tokenizers."""
import torch

from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters import create_drafter
from specdec.drafters.models.cross_tokenizer import CrossTokenizerDrafter
from specdec.engine import SpecDecoder
from specdec.models.backend_choice import make_backend
from specdec.models.loading import LoadedModel, load_model

PROMPTS = ["the cat sat on the mat", "a big red dog ran to the house", "the sun is up and the moon is down"]


def _permuted_twin(target, other):
    """`other`'s tokenizer with the target's weights, rows permuted to that tokenizer's ids: the same model over
    another vocabulary, so its greedy text is the target's."""
    t_vocab, o_vocab = target.tokenizer.get_vocab(), other.tokenizer.get_vocab()
    perm = torch.tensor([o_vocab[token] for token, _ in sorted(t_vocab.items(), key=lambda kv: kv[1])])
    state = {k: v.clone() for k, v in target.hf_model.state_dict().items()}
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        state[name][perm] = target.hf_model.state_dict()[name].clone()
    other.hf_model.load_state_dict(state)
    return LoadedModel(name="twin", hf_model=other.hf_model, tokenizer=other.tokenizer,
                       backend=make_backend(other.hf_model, other.backend.info, "torch"))


def test_a_twin_with_another_tokenizer_is_accepted_and_the_output_is_the_targets(tiny_folder, other_vocab_folder):
    target = load_model(str(tiny_folder), dtype="float32")
    twin = _permuted_twin(target, load_model(str(other_vocab_folder), dtype="float32"))
    drafter = create_drafter("draft-model", target, draft_model=twin)
    assert isinstance(drafter, CrossTokenizerDrafter)
    spec = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4, adaptive=False), chat=False)
    plain = SpecDecoder(target, None, chat=False)
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    for prompt in PROMPTS:
        want, got = plain.generate(prompt, config), spec.generate(prompt, config)
        assert got.token_ids == want.token_ids
        assert got.metrics.accepted_tokens >= 0.9 * got.metrics.drafted_tokens > 0  # the twin's drafts, translated


def test_an_unrelated_draft_with_another_tokenizer_changes_nothing(tiny_folder, other_vocab_folder):
    target = load_model(str(tiny_folder), dtype="float32")
    drafter = create_drafter("draft-model", target, draft_model=load_model(str(other_vocab_folder), dtype="float32"))
    coupled = SpeculationConfig(num_speculative_tokens=3, adaptive=False, sampling_verifier="coupled")
    spec, plain = SpecDecoder(target, drafter, coupled, chat=False), SpecDecoder(target, None, coupled, chat=False)
    for prompt in PROMPTS:
        for config in (GenerationConfig(max_new_tokens=20, ignore_eos=True),
                       GenerationConfig.create(max_new_tokens=20, ignore_eos=True, temperature=1.0, seed=7)):
            got = spec.generate(prompt, config)
            assert got.token_ids == plain.generate(prompt, config).token_ids
            assert got.metrics.drafted_tokens > 0


def test_batched_requests_draft_through_text_each_with_its_own_fork(tiny_folder, other_vocab_folder):
    target = load_model(str(tiny_folder), dtype="float32")
    twin = _permuted_twin(target, load_model(str(other_vocab_folder), dtype="float32"))
    spec = SpecDecoder(target, create_drafter("draft-model", target, draft_model=twin),
                       SpeculationConfig(num_speculative_tokens=3, adaptive=False), chat=False)
    config = GenerationConfig(max_new_tokens=16, ignore_eos=True)
    results = spec.generate_many(PROMPTS, config, max_batch=3)
    plain = SpecDecoder(target, None, chat=False)
    assert [r.token_ids for r in results] == [plain.generate(p, config).token_ids for p in PROMPTS]
    assert all(r.metrics.accepted_tokens > 0 for r in results)
