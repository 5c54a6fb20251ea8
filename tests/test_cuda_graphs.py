"""The CUDA graph path on a GPU: captured passes, compiled passes, drafting steps and verification on the device
equal the same code uncaptured, and a step synchronises with the host once.

Skipped where torch sees no CUDA GPU (CI has none); the same code runs uncaptured on the CPU in tests/test_static_pass.py,
test_graphs_greedy.py, test_compiled_pass.py, test_device_drafting.py, test_device_verify.py and
test_device_sampling.py. On a GPU machine: python -m pytest -n 0 tests/test_cuda_graphs.py
"""
import pytest
import torch

from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters import create_drafter
from specdec.engine import SpecDecoder
from test_cuda import PROMPTS, _hf_greedy

# ---- CUDA graphs (models/pass_graphs.py) and verification on the device ---------------------------------------
needs_capture = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")


def _assert_same_passes(first, second, atol: float) -> None:
    """Runs the same passes on two backends of one model, each over three sequences in scattered slots (1, 3, 5):
    decode, a chain, a tree and two batches; their logits, hidden states (float32, to rounding) and cache lengths
    agree."""
    from specdec.verify import tree_mask

    gen = torch.Generator().manual_seed(0)
    pairs = []
    for backend in (first, second):
        caches = [backend.new_cache() for _ in range(6)][1::2]
        for cache, n in zip(caches, (7, 19, 30)):
            backend.forward(cache, torch.arange(n) % 40, last_only=True)
        pairs.append(caches)
    steps = [([1], None), ([5], None), ([7], tree_mask([-1, -1, 0, 2, 1, 0])), ([1, 1, 1], None), ([3, 1, 6], None)]
    for counts, mask in steps:
        ids = [torch.randint(0, 40, (n,), generator=gen) for n in counts]
        outs = []
        for backend, caches in zip((first, second), pairs):
            if len(counts) == 1:
                outs.append([backend.forward(caches[0], ids[0], tree_mask=mask, output_hidden=True)])
            else:
                outs.append(backend.forward_batch(caches[:len(counts)], ids, output_hidden=True))
        for got, want in zip(*outs):
            torch.testing.assert_close(got.logits, want.logits, rtol=1e-5, atol=atol)
            torch.testing.assert_close(got.hidden, want.hidden, rtol=1e-5, atol=atol)
        assert [c.length for c in pairs[0]] == [c.length for c in pairs[1]]


@needs_capture
def test_tiny_replayed_graphs_equal_the_uncaptured_static_pass(tiny_folder):
    """Each bucket's replay gives what the same shape-static pass gives run directly, for decode, chains, a tree and
    a batch of rows in scattered slots; and the caches advance alike."""
    from specdec.models.loading import load_model

    from specdec.models.llama import FastLlama

    loaded = load_model(str(tiny_folder), device="cuda", dtype="float32", backend="torch", graphs="auto")
    captured = loaded.backend
    assert captured.pass_graphs.capture and captured.pass_graphs._buckets[(1, 1)].graphs
    direct = FastLlama(loaded.hf_model, loaded.info, graphs="eager")  # the same passes, uncaptured on the GPU
    _assert_same_passes(captured, direct, atol=1e-5)


@needs_capture
def test_tiny_compiled_captured_passes_equal_the_eager_forward(tiny_folder):
    """The passes compiled by torch.compile (models/compiled_pass.py), then captured and replayed, give the eager
    forward's logits and hidden states (float32, to rounding) for decode, a chain, a tree and a batch in scattered
    slots; each bucket was compiled before its capture, and replays compile nothing. Two batch sizes and two token
    counts keep the compile time short."""
    from torch._dynamo.utils import counters

    from specdec.models.llama import FastLlama
    from specdec.models.loading import load_model
    from specdec.models.pass_graphs import PassGraphs

    loaded = load_model(str(tiny_folder), device="cuda", dtype="float32", backend="torch", graphs="off")
    compiled = FastLlama(loaded.hf_model, loaded.info, slots=6, graphs="eager")
    compiled.pass_graphs = PassGraphs(compiled, capture=True, compile=True, batch_sizes=(1, 4), token_counts=(1, 8))
    compiled.pass_graphs.prepare()
    graphs_at_load = counters["stats"]["unique_graphs"]
    eager = FastLlama(loaded.hf_model, loaded.info, slots=6)
    _assert_same_passes(compiled, eager, atol=2e-5)
    assert counters["stats"]["unique_graphs"] == graphs_at_load  # every pass replayed a graph compiled at load


@needs_capture
@pytest.mark.parametrize("name", ["ngram", "draft-model"])
def test_tiny_greedy_output_with_captured_graphs_equals_graphs_off(tiny_folder, tiny_draft_folder, name):
    from specdec.models.loading import load_model

    graphs = load_model(str(tiny_folder), device="cuda", dtype="float32", backend="torch", graphs="auto")
    eager = load_model(str(tiny_folder), device="cuda", dtype="float32", backend="torch", graphs="off")
    assert graphs.backend.pass_graphs.capture and eager.backend.pass_graphs is None
    options = {"draft_model": str(tiny_draft_folder)} if name == "draft-model" else {}
    spec = SpecDecoder(graphs, create_drafter(name, graphs, **options),
                       SpeculationConfig(num_speculative_tokens=6, adaptive=False), chat=False)
    plain = SpecDecoder(eager, None, chat=False)
    config = GenerationConfig(max_new_tokens=30, ignore_eos=True)
    for text in PROMPTS:
        ids = spec.encode(text)
        got = spec.generate_ids(ids, config)[0]
        reference = _hf_greedy(eager, ids, 30)
        assert got == plain.generate_ids(ids, config)[0] and got[:len(reference)] == reference, text
    batched = spec.generate_many(PROMPTS, config, max_batch=3)
    assert [r.token_ids for r in batched] == [plain.generate_ids(spec.encode(t), config)[0] for t in PROMPTS]


@needs_capture
def test_greedy_verification_on_the_gpu_synchronises_once():
    import warnings

    from specdec.verify import greedy_verify, tree_greedy_verify

    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(9, 50, generator=gen)
    draft = logits.argmax(-1)[:8].clone()
    draft[5] = (draft[5] + 1) % 50
    parents = [-1, -1, 0, 1, 3, 2, 4, 0]
    cases = [(lambda x: greedy_verify(draft, x)), (lambda x: tree_greedy_verify(draft, parents, x))]
    for case in cases:
        want = case(logits)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            device_logits = logits.cuda()
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
            try:
                got = case(device_logits)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        assert got == want
        syncs = [w for w in seen if "synchroniz" in str(w.message).lower()]
        assert len(syncs) == 1, [str(w.message) for w in syncs]


@needs_capture
@pytest.mark.parametrize("tree", [False, True])
def test_tiny_captured_eagle_drafting_equals_uncaptured_and_synchronises_once(tiny_folder, tree):
    """EAGLE drafting on the device (drafters/eagle_device.py): a head on the GPU drafts with captured graphs what
    the same steps give uncaptured, chains and trees, and a step after the first reads back to the host once."""
    import warnings

    from specdec.drafters.base import Budget, DraftRequest
    from specdec.drafters.heads.eagle import EagleDrafter
    from specdec.drafters.heads.eagle_head import new_head
    from specdec.drafters.heads.head_graphs import HeadGraphs
    from specdec.models.loading import load_model

    target = load_model(str(tiny_folder), device="cuda", dtype="float32", backend="torch", graphs="auto")
    torch.manual_seed(1)
    head = new_head(target.hf_model, "tiny", torch.arange(target.info.vocab_size))
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    head = head.to("cuda")
    shape = {"tree": tree, "width": 3, "lookup": False, "fixed_size": True, "max_nodes": 10}
    captured, uncaptured = EagleDrafter(head, **shape), EagleDrafter(head, **shape)
    assert captured.device_drafting and captured.graphs.capture
    uncaptured.graphs = HeadGraphs(head, uncaptured.cache, capture=False)
    tokens = torch.randint(0, target.info.vocab_size - 1, (60,), generator=torch.Generator().manual_seed(5)).tolist()
    hidden = target.backend.forward(target.backend.new_cache(), torch.tensor(tokens), output_hidden=True).hidden
    for drafter in (captured, uncaptured):
        drafter.begin(DraftRequest(prompt_ids=tokens[:20]))
        drafter.observe(hidden[:19])
    for end in (20, 23, 24, 30, 41, 60, 63):
        drafts = []
        for drafter in (captured, uncaptured):
            drafter.observe(hidden[drafter.feat.shape[0]:end - 1])
            graphs_before = len(drafter.graphs._graphs)
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    drafts.append(drafter.propose(tokens[:end], Budget(5, tree=tree)))
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            if drafter is captured and len(drafter.graphs._graphs) == graphs_before:  # capturing synchronises
                syncs = [str(w.message) for w in seen if "synchroniz" in str(w.message).lower()]
                assert len(syncs) == 1, syncs
        assert drafts[0].tokens.tolist() == drafts[1].tokens.tolist() and drafts[0].parents == drafts[1].parents


@needs_capture
def test_tiny_captured_feed_equals_uncaptured(tiny_folder):
    """The bucketed feed of a step's true pairs (eagle_device.feed_pairs) replayed as a graph leaves the head cache
    and gives the head's output as the same feed run directly on the GPU, for each bucket and with padding."""
    from specdec.drafters.heads.eagle_device import HeadCache
    from specdec.drafters.heads.eagle_head import new_head
    from specdec.drafters.heads.head_graphs import FEED_BUCKETS, HeadGraphs
    from specdec.models.loading import load_model

    target = load_model(str(tiny_folder), device="cuda", dtype="float32", backend="torch", graphs="auto")
    torch.manual_seed(1)
    head = new_head(target.hf_model, "tiny", torch.arange(target.info.vocab_size)).to("cuda")
    ids = torch.randint(0, target.info.vocab_size - 1, (120,), generator=torch.Generator().manual_seed(5))
    hidden = target.backend.forward(target.backend.new_cache(), ids, output_hidden=True).hidden
    tokens = ids.cuda()
    features = head.fuse(hidden[:, :head.config.hidden_size])
    caches = [HeadCache(head.config, torch.device("cuda"), head.feature_dtype, capacity=64) for _ in range(2)]
    graphs = [HeadGraphs(head, cache, capture=capture) for cache, capture in zip(caches, (True, False))]
    with torch.inference_mode():
        for cache in caches:
            cache.append(head(features[None, :9], tokens[None, 1:10], torch.arange(9, device="cuda")[None])[1])
        for n in (1, 2, 3, 4, 5, 8, 11, 16, 1, 7):  # the buffer grows past 64 rows on the way: graphs recaptured
            start = caches[0].length
            outs = [g.feed(features[start:start + n], tokens[start + 1:start + n + 1]) for g in graphs]
            torch.testing.assert_close(outs[0], outs[1])
            assert caches[0].length == caches[1].length == start + n
            for mine, theirs in zip(caches[0].past(), caches[1].past()):
                torch.testing.assert_close(mine, theirs)
        assert {key[:2] for key in graphs[0]._graphs} <= {("feed", b) for b in FEED_BUCKETS}


@needs_capture
def test_tiny_captured_medusa_steps_equal_uncaptured(tiny_folder):
    """Medusa's device step (drafters/medusa_device.py) replayed as a graph gives each head's candidates as the
    same step run directly on the GPU."""
    from specdec.drafters.heads.medusa_device import MedusaGraphs
    from specdec.models.loading import load_model
    from tiny import random_medusa_heads

    target = load_model(str(tiny_folder), device="cuda", dtype="float32", backend="torch", graphs="auto")
    heads = random_medusa_heads(target.hf_model).to("cuda")
    captured, direct = MedusaGraphs(heads, capture=True), MedusaGraphs(heads, capture=False)
    ids = torch.arange(30) % (target.info.vocab_size - 1)
    hidden = target.backend.forward(target.backend.new_cache(), ids, output_hidden=True).hidden
    for row in (3, 17, 29):
        for width in (1, 3):
            got, want = captured.top(hidden[row], 4, width), direct.top(hidden[row], 4, width)
            assert got[1] == want[1]
            assert torch.allclose(torch.tensor(got[0]), torch.tensor(want[0]), atol=1e-5)


@needs_capture
@pytest.mark.parametrize("generator_device", ["cpu", "cuda"])
def test_sampling_verification_on_the_gpu_synchronises_once(generator_device):
    """verify() on cuda logits takes the device rules (device_sampling.py): rejection sampling (chains with and
    without q, trees) and coupled sampling (its tokens the CPU's for the same noise), each with one synchronisation,
    whether the request's generator is a CPU or a CUDA one."""
    import warnings

    from specdec.config import SamplingConfig
    from specdec.sampling import probs_from_logits
    from specdec.verify import Draft, verify

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(9, 50, generator=gen) * 3
    tokens = logits.argmax(-1)[:8].clone()
    tokens[5] = (tokens[5] + 1) % 50
    q = torch.softmax(torch.randn(8, 50, generator=gen), -1)
    parents = [-1, -1, 0, 1, 3, 2, 4, 0]
    noise = -torch.log(-torch.log(torch.rand(9, 50, generator=gen).clamp_(min=1e-30)))
    sampling = SamplingConfig(temperature=0.8, top_k=20)
    drafts = [Draft(tokens), Draft(tokens, probs=q), Draft(tokens, parents=parents), Draft.empty()]
    for draft in drafts:
        rows = len(draft) + 1
        for coupled in (False, True):
            on_cpu = noise[:rows]
            want = verify(draft, logits[:rows], sampling, noise=(lambda _: on_cpu) if coupled else None)
            device_logits, device_noise = logits[:rows].cuda(), noise[:rows].cuda()
            generator = torch.Generator(device=generator_device).manual_seed(0)
            torch.cuda.synchronize()
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    got = verify(draft, device_logits, sampling, generator,
                                 noise=(lambda _: device_noise) if coupled else None)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            syncs = [w for w in seen if "synchroniz" in str(w.message).lower()]
            assert len(syncs) == 1, (len(draft), coupled, [str(w.message) for w in syncs])
            path, token = got
            if coupled:
                assert got == want  # deterministic given the noise
            elif draft.parents is None:
                assert path == list(range(len(path)))
            else:
                assert all(parents[b] == a for a, b in zip([-1] + path, path))  # a path down the tree
            row = (path[-1] + 1) if path else 0
            assert probs_from_logits(logits[row], sampling)[token] > 0  # a token the sampler allows there
