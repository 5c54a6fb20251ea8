"""`specdec serve` answers through the official openai client as the engine does for the same request: chat and
completions, streamed and not, equal the model's greedy text; a conversation's later turn reuses the earlier ones
from the prefix cache; stop strings, seeds, penalties and logit_bias reach the sampler; `n` choices each equal the
request sent alone with its seed."""
import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")

from served import metric, prompt  # noqa: E402


def test_chat_and_completions_streaming_and_not_give_the_models_greedy_text(openai_client, local_decoders):
    chat_decoder, raw_decoder = local_decoders
    messages = [{"role": "system", "content": "the sky"}, {"role": "user", "content": "the cat sat on the mat"}]
    want = chat_decoder.generate(messages, max_new_tokens=20, temperature=0.0)
    got = openai_client.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0)
    assert got.choices[0].message.content == want.text and got.choices[0].message.role == "assistant"
    assert got.choices[0].finish_reason == want.finish_reason
    assert got.usage.prompt_tokens == len(want.prompt_ids) and got.usage.completion_tokens == len(want.token_ids)
    chunks = list(openai_client.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0,
                                                        stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == want.finish_reason

    want = raw_decoder.generate("a big red dog", max_new_tokens=15, temperature=0.0, ignore_eos=True)
    got = openai_client.completions.create(model="tiny", prompt="a big red dog", max_tokens=15, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert got.choices[0].text == want.text and got.choices[0].finish_reason == "length"
    assert got.usage.completion_tokens == 15
    chunks = list(openai_client.completions.create(model="tiny", prompt="a big red dog", max_tokens=15, temperature=0,
                                                   stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks) == want.text


def test_a_conversation_reuses_its_earlier_turns_from_the_prefix_cache(openai_client, openai_server, local_decoders):
    """The prefix cache (on by default): a turn's prompt holds the earlier turns, whose cached keys and values it
    reuses (usage.prompt_tokens_details.cached_tokens, and the Prometheus counter); its answer is the model's
    greedy answer all the same."""
    chat_decoder, _ = local_decoders
    messages = [{"role": "system", "content": prompt(3, 20)}, {"role": "user", "content": prompt(4, 12)}]
    before = metric(openai_server, "specdec_prefix_cache_hit_tokens_total")
    first = openai_client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": prompt(5, 8)}]
    want = chat_decoder.generate(messages, max_new_tokens=12, temperature=0.0)
    second = openai_client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    assert second.choices[0].message.content == want.text
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens <= cached < second.usage.prompt_tokens
    assert metric(openai_server, "specdec_prefix_cache_hit_tokens_total") - before >= cached


def test_stop_strings_and_seeds(openai_client, local_decoders):
    _, raw_decoder = local_decoders
    full = raw_decoder.generate("a big red dog", max_new_tokens=30, temperature=0.0, ignore_eos=True).text
    stop = " ".join(full.split()[3:5])
    want = raw_decoder.generate("a big red dog", max_new_tokens=30, temperature=0.0, ignore_eos=True, stop=[stop])
    for stream in (False, True):
        got = openai_client.completions.create(model="tiny", prompt="a big red dog", max_tokens=30, temperature=0,
                                               stop=stop, stream=stream, extra_body={"ignore_eos": True})
        chunks = list(got) if stream else [got]
        assert "".join(c.choices[0].text for c in chunks) == want.text == full[: full.index(stop)]
        assert chunks[-1].choices[0].finish_reason == "stop"
    sampled = [openai_client.completions.create(model="tiny", prompt="the sun", max_tokens=20, temperature=0.9,
                                                top_p=0.9, seed=7, extra_body={"top_k": 20}).choices[0].text
               for _ in range(2)]
    assert sampled[0] == sampled[1]


def test_penalties_and_logit_bias(openai_client, local_decoders):
    """OpenAI's presence and frequency penalties and logit_bias, and vLLM's repetition_penalty and min_p, reach the
    sampler chain: the text equals the engine's for the same request."""
    _, raw_decoder = local_decoders
    penalties = dict(presence_penalty=0.8, frequency_penalty=0.6)
    extra = dict(repetition_penalty=1.3, min_p=0.05, ignore_eos=True)
    want = raw_decoder.generate("the cat sat on the mat", max_new_tokens=20, temperature=0.0, **penalties, **extra)
    plain = raw_decoder.generate("the cat sat on the mat", max_new_tokens=20, temperature=0.0, ignore_eos=True)
    assert want.text != plain.text
    got = openai_client.completions.create(model="tiny", prompt="the cat sat on the mat", max_tokens=20, temperature=0,
                                           **penalties, extra_body=extra)
    assert got.choices[0].text == want.text
    word = raw_decoder.target.tokenizer.convert_tokens_to_ids("moon")
    got = openai_client.completions.create(model="tiny", prompt="the cat", max_tokens=5, temperature=0,
                                           logit_bias={str(word): 100}, extra_body={"ignore_eos": True})
    assert got.choices[0].text.split() == ["moon"] * 5


def test_n_choices_each_equal_the_request_sent_alone_with_its_seed(openai_client):
    """`n` choices run as n engine requests over one prompt: with a seed, choice i is the request sent alone with
    seed + i; usage counts the prompt once and every choice's completion; streamed, every chunk names its choice."""
    # drafting off: with rejection sampling a sample depends on how many tokens were drafted, which the adaptive
    # policy decides from measured times (coupled verification would make them seed-stable)
    common = dict(model="tiny", prompt="the cat sat on", max_tokens=8, temperature=0.9,
                  extra_body={"ignore_eos": True, "speculation": {"enabled": False}})
    got = openai_client.completions.create(n=3, seed=11, **common)
    assert [c.index for c in got.choices] == [0, 1, 2]
    alone = [openai_client.completions.create(seed=11 + i, **common).choices[0].text for i in range(3)]
    assert [c.text for c in got.choices] == alone
    assert len(set(alone)) > 1, "three samples at temperature 0.9 should not all agree"
    assert got.usage.completion_tokens == 24 and got.usage.prompt_tokens == openai_client.completions.create(
        seed=1, **common).usage.prompt_tokens
    assert got.usage.model_extra["speculation"]["verify_steps"] >= 3

    chunks = list(openai_client.completions.create(n=3, seed=11, stream=True, stream_options={"include_usage": True},
                                                   **common))
    texts, finished = ["", "", ""], set()
    for c in chunks[:-1]:
        texts[c.choices[0].index] += c.choices[0].text
        if c.choices[0].finish_reason:
            finished.add(c.choices[0].index)
    assert texts == alone and finished == {0, 1, 2}
    assert chunks[-1].usage.completion_tokens == 24

    messages = [{"role": "user", "content": "the dog ran"}]
    chat = list(openai_client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0, n=2,
                                                      stream=True))
    roles = [c.choices[0].index for c in chat if c.choices[0].delta.role == "assistant"]
    replies = ["", ""]
    for c in chat:
        replies[c.choices[0].index] += c.choices[0].delta.content or ""
    assert roles == [0, 1] and replies[0] == replies[1] != ""  # greedy: both choices are the same text
    whole = openai_client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0, n=2)
    assert [c.message.content for c in whole.choices] == replies
