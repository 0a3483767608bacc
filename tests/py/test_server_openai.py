"""The server through the official openai client: chat (plain and streaming), completions,
models, stop strings, usage, seeds, logprobs and reasoning_content."""
import json
import re

import pytest

from server_util import Server

MSG = [{"role": "user", "content": "Tell me a story about a cat."}]


@pytest.fixture(scope="module")
def srv():
    with Server("--alias", "tiny-test") as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return srv.client()


def test_models(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny-test"]
    assert models[0].model_extra["context_length"] == 4096


def test_model_retrieve(client, srv):
    """GET /v1/models/{id} (the SDK's models.retrieve) by either name the model answers to;
    another name is a 404 model_not_found, the server serving on."""
    m = client.models.retrieve("tiny-test")
    assert m.id == "tiny-test" and m.object == "model" and m.model_extra["context_length"] == 4096
    assert client.models.retrieve("serve-tiny").id == "serve-tiny"  # the directory's name
    import openai
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    status, _, e = srv.request("GET", "/v1/models/org/other")
    assert status == 404 and json.loads(e)["error"]["code"] == "model_not_found"
    status, _, e = srv.request("GET", "/v1/models/" + "x" * 300)  # longer than any id
    assert status == 404 and json.loads(e)["error"]["code"] == "model_not_found"
    status, _, e = srv.request("POST", "/v1/models/tiny-test", {})
    assert status == 405
    with Server("--alias", "org/tiny") as s:  # an id with a slash is the rest of the path
        status, _, body = s.request("GET", "/v1/models/org/tiny")
        assert status == 200 and json.loads(body)["id"] == "org/tiny"


def test_several_names_and_any_model(srv):
    """--alias may be given several times: the model answers to each (and to its directory's
    name), the first is its id, and an answer names it as the request did. --any-model:
    any name is accepted (clients with their vendor's model names), and answered with."""
    import subprocess
    from server_util import binary, tiny_model

    def ask(s, name, path="/v1/chat/completions"):
        body = {"model": name, "max_tokens": 2, "messages": MSG}
        return s.post(path, body)

    with Server("--alias", "a", "--alias", "org/b") as s:
        for name in ("a", "org/b", "serve-tiny"):
            st, _, r = ask(s, name)
            assert st == 200 and r["model"] == name, r
            st, _, m = s.request("GET", "/v1/models/" + name)
            assert st == 200 and json.loads(m)["id"] == name
        st, _, r = ask(s, "c")
        assert st == 404 and r["error"]["code"] == "model_not_found" and "'a'" in r["error"]["message"]
        st, _, m = s.request("GET", "/v1/models")
        assert [x["id"] for x in json.loads(m)["data"]] == ["a"]
    with Server("--alias", "mine", "--any-model") as s:
        for name in ("claude-sonnet-4-5", "gpt-4o", "mine"):
            st, _, r = ask(s, name)
            assert st == 200 and r["model"] == name, r
            st, _, r = ask(s, name, "/v1/messages")
            assert st == 200 and r["model"] == name, r
            st, _, m = s.request("GET", "/v1/models/" + name)
            assert st == 200 and json.loads(m)["id"] == name
        st, _, r = ask(s, "x" * 256)
        assert st == 400 and r["error"]["param"] == "model", r
        st, _, r = ask(s, "x" * 255)
        assert st == 200 and r["model"] == "x" * 255
        st, _, m = s.request("GET", "/v1/models/" + "y" * 300)
        assert st == 404
        st, _, m = s.request("GET", "/v1/models")
        assert [x["id"] for x in json.loads(m)["data"]] == ["mine"]
    # bad names, too many
    for args in (["--alias", ""], ["--alias", "*"], ["--alias", "z" * 256],
                 sum((["--alias", f"n{i}"] for i in range(9)), [])):
        p = subprocess.run([binary(), "serve", "-m", tiny_model(), "--port", "0", *args],
                           capture_output=True, timeout=30)
        assert p.returncode == 1 and b"alias" in p.stderr, (args, p.stderr)  # usage


def test_chat_non_streaming(client):
    r = client.chat.completions.create(model="tiny-test", messages=MSG, max_tokens=12,
                                       temperature=0)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    assert r.model == "tiny-test"
    c = r.choices[0]
    assert c.message.role == "assistant" and isinstance(c.message.content, str)
    assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_chat_streaming_matches_non_streaming(client):
    full = client.chat.completions.create(model="tiny-test", messages=MSG, max_tokens=20,
                                          temperature=0)
    chunks = list(client.chat.completions.create(
        model="tiny-test", messages=MSG, max_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert len({c.id for c in chunks}) == 1


def test_stream_without_usage_has_no_usage_chunk(client):
    chunks = list(client.chat.completions.create(model="tiny-test", messages=MSG, max_tokens=4,
                                                 temperature=0, stream=True))
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)


def test_completions(client):
    r = client.completions.create(model="tiny-test", prompt="Once upon a time", max_tokens=10,
                                  temperature=0)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 10
    chunks = list(client.completions.create(model="tiny-test", prompt="Once upon a time",
                                            max_tokens=10, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text


def test_completions_default_max_tokens_is_16(client):
    r = client.completions.create(model="tiny-test", prompt="Hello", temperature=0)
    assert r.usage.completion_tokens == 16


def _greedy(client, n=40):
    return client.completions.create(model="tiny-test", prompt="The weather today", max_tokens=n,
                                     temperature=0).choices[0].text


def test_stop_string(client):
    text = _greedy(client)
    # a stop taken from the middle of the greedy output, spanning whatever tokens it spans
    stop = text[len(text) // 2: len(text) // 2 + 3]
    assert len(stop) == 3 and stop.strip(), text
    cut = text[: text.index(stop)]
    r = client.completions.create(model="tiny-test", prompt="The weather today", max_tokens=40,
                                  temperature=0, stop=[stop, "\x01never"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == cut
    chunks = list(client.completions.create(model="tiny-test", prompt="The weather today",
                                            max_tokens=40, temperature=0, stop=stop,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stop_on_chat(client):
    full = client.chat.completions.create(model="tiny-test", messages=MSG, max_tokens=30,
                                          temperature=0).choices[0].message.content
    stop = full[len(full) // 3: len(full) // 3 + 2]
    r = client.chat.completions.create(model="tiny-test", messages=MSG, max_tokens=30,
                                       temperature=0, stop=stop)
    assert r.choices[0].message.content == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_seed_reproducible(client):
    def run(seed):
        return client.chat.completions.create(model="tiny-test", messages=MSG, max_tokens=24,
                                              temperature=1.0, top_p=0.95, seed=seed
                                              ).choices[0].message.content
    a, b, c = run(7), run(7), run(8)
    assert a == b
    assert a != c


def test_sampling_fields_accepted(client):
    r = client.chat.completions.create(model="tiny-test", messages=MSG, max_tokens=5,
                                       temperature=0.7, top_p=0.9, presence_penalty=0.5,
                                       frequency_penalty=0.5, seed=1,
                                       extra_body={"top_k": 20, "min_p": 0.05,
                                                   "repetition_penalty": 1.1})
    assert r.usage.completion_tokens == 5


def test_repetition_penalty_changes_greedy_output(client):
    base = _greedy(client, 30)
    pen = client.completions.create(model="tiny-test", prompt="The weather today", max_tokens=30,
                                    temperature=0, frequency_penalty=2.0).choices[0].text
    assert base != pen


def test_penalties_same_through_either_decode_path(client):
    # without logprobs each step draws its token in the forward (on a GPU, on the device) with the
    # penalties sent along as logit adjustments; with logprobs the logits come to the server,
    # which applies the penalties itself: both must give the same tokens
    def run(**extra):
        return client.completions.create(model="tiny-test", prompt="The weather today",
                                         max_tokens=30, frequency_penalty=1.5,
                                         presence_penalty=0.5, seed=3,
                                         extra_body={"repetition_penalty": 1.3}, **extra
                                         ).choices[0].text
    for temperature in (0, 1.0):
        assert run(temperature=temperature) == run(temperature=temperature, logprobs=1)


def test_repetition_penalty_reaches_prompt_tokens(client):
    # the first token's distribution depends on the prompt's tokens alone (no answer yet): a
    # repetition penalty must change it when the prompt holds 400 of the 1000 token ids
    def first(**extra):
        r = client.completions.create(model="tiny-test", prompt=list(range(3, 403)), max_tokens=1,
                                      temperature=0, logprobs=5, **extra)
        return r.choices[0].logprobs.top_logprobs[0]
    base = first()
    assert base == first(extra_body={"repetition_penalty": 1.0})
    assert base != first(extra_body={"repetition_penalty": 2.0})


def test_logprobs(client):
    r = client.chat.completions.create(model="tiny-test", messages=MSG, max_tokens=6,
                                       temperature=0, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert len(lp) == 6
    for e in lp:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert abs(e.top_logprobs[0].logprob - e.logprob) < 1e-5
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob


def _collapse(text):
    """Runs of U+FFFD as one: how many a broken UTF-8 sequence turns into is not at stake."""
    return re.sub("\ufffd+", "\ufffd", text)


def test_streamed_logprobs_go_with_their_text(srv):
    """A streamed chunk carries the log-probabilities of the tokens whose text it brings: at
    every chunk the text so far is what the tokens so far spell (less a character they have not
    finished), never a token ahead of them. The decoder publishes a token's text and its
    log-probability together; a reader that caught the text alone sent it with the previous
    tokens' and the token's with the next chunk (or, last, with none)."""
    only_text = {str(i): -100 for i in range(1000, 4096)}  # no special token: all content
    split = 0
    for r in range(12):
        body = dict(messages=[{"role": "user", "content": f"Tell me story {r}."}], max_tokens=40,
                    temperature=0, logit_bias=only_text, logprobs=True, top_logprobs=1)
        st, _, want = srv.post("/v1/chat/completions", body)
        assert st == 200
        st, _, data = srv.request("POST", "/v1/chat/completions", dict(body, stream=True))
        assert st == 200
        text, raw, lps = "", b"", []
        for line in data.decode().splitlines():
            if not line.startswith("data: {"):
                continue
            c = json.loads(line[len("data: "):])["choices"][0]
            got = (c.get("logprobs") or {}).get("content") or []
            lps += got
            raw += b"".join(bytes(e["bytes"]) for e in got)
            text += c["delta"].get("content") or ""
            if c["finish_reason"] is None:
                spelt = _collapse(raw.decode("utf-8", "replace"))
                assert spelt.startswith(_collapse(text)), (r, text, spelt)
        assert text == want["choices"][0]["message"]["content"]
        assert lps == want["choices"][0]["logprobs"]["content"]
        # `bytes` are each token's own (a byte token's one byte, not U+FFFD's three): joined,
        # they spell the whole answer
        assert _collapse(raw.decode("utf-8", "replace")) == _collapse(text)
        split += any(len(e["bytes"]) == 1 and e["bytes"][0] >= 0x80 for e in lps)
    assert split  # the answers had characters that tokens split


def test_answer_ending_inside_a_character(srv):
    """An answer whose last text token is a byte that begins a character (0xE4, token 160 of
    the fixtures' tokenizer) and that then ends at <|im_end|> shows the unfinished character as
    U+FFFD, as Hugging Face's decode of the answer does (and as an answer cut by length does);
    it used to be dropped. Streamed, the same text comes in the chunks."""
    bias = {str(i): -100 for i in range(1000, 4096)}
    bias.update({"160": 50, "1002": 100})  # min_tokens bans <|im_end|> for the first token
    body = dict(messages=[{"role": "user", "content": "Hi"}], max_tokens=5, temperature=0,
                min_tokens=1, logit_bias=bias)
    st, _, r = srv.post("/v1/chat/completions", body)
    assert st == 200, r
    c = r["choices"][0]
    assert (c["message"]["content"], c["finish_reason"]) == ("\ufffd", "stop")
    assert r["usage"]["completion_tokens"] == 2
    st, _, data = srv.request("POST", "/v1/chat/completions", dict(body, stream=True))
    assert st == 200
    text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                   for line in data.decode().splitlines()
                   if line.startswith("data: {") and json.loads(line[6:])["choices"])
    assert text == "\ufffd"
    # cut by length inside the character: the same
    st, _, r = srv.post("/v1/chat/completions", dict(body, max_tokens=1))
    assert r["choices"][0]["message"]["content"] == "\ufffd"


def test_reasoning_content(client, srv):
    # with thinking on, the prompt ends inside <think>: everything up to </think> is reasoning.
    # A random model rarely closes the block, so all its text must be reasoning, none content.
    r = client.chat.completions.create(model="tiny-test", messages=MSG, max_tokens=20,
                                       temperature=0,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    msg = r.choices[0].message
    assert msg.model_extra.get("reasoning_content")
    assert msg.content == ""
    chunks = list(client.chat.completions.create(
        model="tiny-test", messages=MSG, max_tokens=20, temperature=0, stream=True,
        extra_body={"chat_template_kwargs": {"enable_thinking": True}}))
    streamed = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                       for c in chunks if c.choices)
    assert streamed == msg.model_extra["reasoning_content"]
    # thinking off: no reasoning_content at all
    r = client.chat.completions.create(model="tiny-test", messages=MSG, max_tokens=20,
                                       temperature=0, reasoning_effort="none")
    assert "reasoning_content" not in (r.choices[0].message.model_extra or {})


def test_reasoning_split_when_model_closes_think(srv):
    # Force the split with a raw completion whose prompt opens <think>: ids for "</think>" in the
    # prompt close it, so the model's answer is content.
    st, _, body = srv.post("/v1/completions", {"prompt": "<think>\nhm\n</think>\n\nHi",
                                                "max_tokens": 5, "temperature": 0})
    assert st == 200 and body["choices"][0]["text"] is not None


def test_tokenize_detokenize(srv):
    st, _, t = srv.post("/tokenize", {"content": "Hello world"})
    assert st == 200 and t["count"] == len(t["tokens"]) > 0 and t["max_model_len"] == 4096
    st, _, d = srv.post("/detokenize", {"tokens": t["tokens"]})
    assert st == 200 and d["content"] == "Hello world"
    st, _, t2 = srv.post("/tokenize", {"messages": MSG})
    u = srv.client().chat.completions.create(model="tiny-test", messages=MSG, max_tokens=1)
    assert t2["count"] == u.usage.prompt_tokens


def test_apply_template(srv):
    """POST /apply-template (llama-server's) gives the prompt text a chat request becomes: the
    text whose tokens are the request's prompt, in the model's chat format, with what the
    request asks of the template (tools, thinking) in it."""
    st, _, r = srv.post("/apply-template", {"messages": MSG})
    assert st == 200, r
    assert r["prompt"].startswith("<|im_start|>user\nTell me a story about a cat.<|im_end|>\n"
                                  "<|im_start|>assistant\n"), r
    st, _, t = srv.post("/tokenize", {"messages": MSG})
    st2, _, t2 = srv.post("/tokenize", {"content": r["prompt"]})
    assert st == st2 == 200 and t["tokens"] == t2["tokens"]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    st, _, r2 = srv.post("/apply-template", {"messages": MSG, "tools": tools,
                                             "chat_template_kwargs": {"enable_thinking": True}})
    assert st == 200 and r2["prompt"].startswith("<|im_start|>system\n"), r2
    assert '"name": "get_weather"' in r2["prompt"] and r2["prompt"].endswith("<think>\n"), r2
    st, _, e = srv.post("/apply-template", {"messages": [{"role": "wizard", "content": "x"}]})
    assert st == 400 and e["error"]["param"] == "messages[0].role", e
    st, _, e = srv.request("GET", "/apply-template")
    assert st == 405


def test_props(srv):
    """GET /props (llama-server's): the model's names, its context, the lanes, the defaults a
    request that leaves them out is sampled with, and what it reads besides text."""
    st, _, p = srv.request("GET", "/props")
    assert st == 200
    p = json.loads(p)
    assert p["model_alias"] == "tiny-test" and p["model_path"].endswith("serve-tiny")
    assert p["default_generation_settings"]["n_ctx"] == 4096
    d = p["default_generation_settings"]["params"]
    assert d["temperature"] == 1 and d["top_p"] == 1 and d["max_tokens"] is None
    assert p["total_slots"] >= 1
    assert p["modalities"] == {"vision": False, "video": False, "audio": False}
    assert p["embeddings"] is False and p["device"]
    st, _, _ = srv.post("/props", {})
    assert st == 405


def test_multimodal_text_parts(client):
    parts = [{"type": "text", "text": "Tell me a story "}, {"type": "text", "text": "about a cat."}]
    a = client.chat.completions.create(model="tiny-test", max_tokens=8, temperature=0,
                                       messages=[{"role": "user", "content": parts}])
    b = client.chat.completions.create(model="tiny-test", messages=MSG, max_tokens=8,
                                       temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content
