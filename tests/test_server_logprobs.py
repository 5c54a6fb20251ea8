"""`specdec serve`'s logprobs through the official openai client: chat's `logprobs`/`top_logprobs` and completions'
`logprobs` (and `echo`, the prompt's own) are the engine's for the same request, streamed or not."""
import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")


def test_logprobs_are_the_engines_streamed_or_not(openai_client, local_decoders):
    """Chat (`logprobs`, `top_logprobs`) and completions (`logprobs`) return each token's logprob and the most
    likely alternatives: those the engine computes for the same request, in OpenAI's two formats, whether streamed
    or not, with the server's drafter on."""
    chat_decoder, raw_decoder = local_decoders
    tokenizer = raw_decoder.target.tokenizer
    messages = [{"role": "user", "content": "the cat sat on the mat"}]
    want = chat_decoder.generate(messages, max_new_tokens=12, temperature=0.0, logprobs=3)
    got = openai_client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0,
                                                logprobs=True, top_logprobs=3)
    content = got.choices[0].logprobs.content
    assert [c.token for c in content] == [tokenizer.decode([t.token_id]) for t in want.logprobs]
    assert [c.logprob for c in content] == pytest.approx([t.logprob for t in want.logprobs], abs=1e-5)
    for c, w in zip(content, want.logprobs):
        assert [a.token for a in c.top_logprobs] == [tokenizer.decode([i]) for i, _ in w.top]
        assert c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob >= c.top_logprobs[2].logprob
        assert c.bytes == list(c.token.encode())
    chunks = list(openai_client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0,
                                                        logprobs=True, top_logprobs=3, stream=True))
    streamed = [c for ch in chunks if ch.choices and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content]
    assert [(c.token, c.logprob) for c in streamed] == [(c.token, c.logprob) for c in content]

    want = raw_decoder.generate("a big red dog", max_new_tokens=10, temperature=0.0, ignore_eos=True, logprobs=2)
    for stream in (False, True):
        got = openai_client.completions.create(model="tiny", prompt="a big red dog", max_tokens=10, temperature=0,
                                               logprobs=2, stream=stream, extra_body={"ignore_eos": True})
        parts = [c.choices[0].logprobs for c in (list(got) if stream else [got]) if c.choices[0].logprobs]
        tokens = [t for p in parts for t in p.tokens]
        assert tokens == [tokenizer.decode([t.token_id]) for t in want.logprobs]
        assert [lp for p in parts for lp in p.token_logprobs] == pytest.approx([t.logprob for t in want.logprobs],
                                                                               abs=1e-5)
        assert [len(top) for p in parts for top in p.top_logprobs] == [2] * 10
        offsets = [o for p in parts for o in p.text_offset]
        assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(10)]
    plain = openai_client.completions.create(model="tiny", prompt="a big red dog", max_tokens=3)
    assert plain.choices[0].logprobs is None


def test_echo_returns_the_prompt_and_its_logprobs(openai_client, local_decoders):
    """`echo` with `logprobs` (how evaluation harnesses score text through a server): the prompt comes back before
    the completion, and its tokens' logprobs (the first one has none) before the completion's."""
    _, raw_decoder = local_decoders
    tokenizer = raw_decoder.target.tokenizer
    want = raw_decoder.generate("the cat sat on the mat", max_new_tokens=2, temperature=0.0, ignore_eos=True,
                                logprobs=1, prompt_logprobs=1)
    for stream in (False, True):
        got = openai_client.completions.create(model="tiny", prompt="the cat sat on the mat", max_tokens=2,
                                               temperature=0, logprobs=1, echo=True, stream=stream,
                                               extra_body={"ignore_eos": True})
        chunks = list(got) if stream else [got]
        assert "".join(c.choices[0].text for c in chunks) == "the cat sat on the mat" + want.text
        parts = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
        tokens = [t for p in parts for t in p.tokens]
        logprobs = [lp for p in parts for lp in p.token_logprobs]
        entries = want.prompt_logprobs + want.logprobs
        assert tokens == [tokenizer.decode([e.token_id]) for e in entries]
        assert logprobs[0] is None and logprobs[1:] == pytest.approx([e.logprob for e in entries[1:]], abs=1e-5)
        assert [p for p in parts for p in p.top_logprobs][0] is None
    plain = openai_client.completions.create(model="tiny", prompt="the cat", max_tokens=2, temperature=0, echo=True)
    assert plain.choices[0].text.startswith("the cat") and plain.choices[0].logprobs is None
