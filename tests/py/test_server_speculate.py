"""Speculative decoding: tokens guessed from a request's prediction (OpenAI's Predicted Outputs)
or by prompt lookup (--draft-lookup) are checked by the model in one decode step. The answer
must be the one the server gives without guesses - greedy or sampled from a seed, with
penalties, biases, log-probabilities, grammars, stop strings and several choices - in fewer
decode steps when the guesses are right, and the usage says how many guessed tokens the answer
took. The tiny model has linear-attention layers, so wrong guesses are taken back by a rewind
to the mark and a rerun of the tokens after it."""
import json
import time

import pytest

from server_util import Server

PROMPT = "Once upon a time there was a little robot who"
# The tiny model's vocabulary (4096) is larger than its tokenizer's (1033): an answer with the
# ids past the tokenizer's has no text to predict it with, so the answers here keep to the
# tokenizer's ids. (Their text still tokenizes back a little differently at times - byte
# tokens, merges: a prediction from it is mostly, not all, right.)
TEXT_ONLY = {str(i): -100 for i in range(1033, 4096)}


@pytest.fixture(scope="module")
def srv():
    with Server("--cache-mb", "0") as s:
        yield s


@pytest.fixture(scope="module")
def plain():
    with Server("--cache-mb", "0", "--draft-max", "0") as s:
        yield s


def complete(s, text_only=True, **kw):
    body = {"prompt": PROMPT, "temperature": 0, "max_tokens": 40, "ignore_eos": True,
            "return_token_ids": True}
    body.update(kw)
    if text_only:
        body["logit_bias"] = dict(TEXT_ONLY, **kw.get("logit_bias", {}))
    return s.post_ok("/v1/completions", body)


def predict(text):
    """A prediction of text (without NUL characters: the server takes no JSON string with one,
    and the tiny model's byte tokens can make one)."""
    return {"type": "content", "content": text.replace("\0", "")}


def test_a_right_prediction_gives_the_same_answer_in_fewer_steps(srv, plain):
    base = complete(plain)
    ids, text = base["choices"][0]["token_ids"], base["choices"][0]["text"]
    assert len(ids) == 40 and "completion_tokens_details" not in base["usage"]
    before = srv.metrics()
    r = complete(srv, prediction=predict(text))
    after = srv.metrics()
    steps = after["tessera_decode_calls_total"] - before["tessera_decode_calls_total"]
    guessed = after["tessera_draft_tokens_total"] - before["tessera_draft_tokens_total"]
    assert r["choices"][0]["token_ids"] == ids
    assert r["choices"][0]["text"] == text
    d = r["usage"]["completion_tokens_details"]
    assert d["accepted_prediction_tokens"] >= 15, d
    assert r["usage"]["completion_tokens"] == 40
    # the first token comes from the prompt's logits, the other 39 from decode steps: one a
    # step, and one more for each right guess
    assert steps == 39 - d["accepted_prediction_tokens"], (steps, d)
    # every guess checked is counted once, taken or not
    assert d["accepted_prediction_tokens"] + d["rejected_prediction_tokens"] == guessed
    assert after["tessera_draft_accepted_total"] - before["tessera_draft_accepted_total"] == \
        d["accepted_prediction_tokens"]


def test_a_wrong_prediction_changes_nothing_but_the_count(srv, plain):
    base = complete(plain)["choices"][0]
    words = base["text"].split(" ")
    # right at the start, wrong in the middle, right again (an edit), then an invented tail
    mixed = " ".join(words[:4] + ["zebra", "quantum"] + words[6:]) + " and then many more"
    for pred in (mixed, "Completely unrelated words that the model will not say " * 3, "", "a"):
        r = complete(srv, prediction=predict(pred))
        assert r["choices"][0]["token_ids"] == base["token_ids"], pred
        d = r["usage"]["completion_tokens_details"]
        if pred == mixed:
            assert d["accepted_prediction_tokens"] > 5 and d["rejected_prediction_tokens"] > 0
    # as a list of text parts too, and on the chat route
    msgs = [{"role": "user", "content": "Tell me about robots."}]
    c = plain.post_ok("/v1/chat/completions", {"messages": msgs, "temperature": 0,
                                               "max_tokens": 30, "ignore_eos": True,
                                               "logit_bias": TEXT_ONLY})
    text = c["choices"][0]["message"]["content"]
    half = len(text) // 2
    r = srv.post_ok("/v1/chat/completions", {
        "messages": msgs, "temperature": 0, "max_tokens": 30, "ignore_eos": True,
        "logit_bias": TEXT_ONLY, "prediction": {"type": "content", "content": [
            {"type": "text", "text": text[:half].replace("\0", "")},
            {"type": "text", "text": text[half:].replace("\0", "")}]}})
    assert r["choices"][0]["message"]["content"] == text
    assert r["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] >= 8


SAMPLED = [
    {"temperature": 0.9, "seed": 11},
    {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "seed": 12},
    {"temperature": 1.0, "min_p": 0.05, "seed": 13, "frequency_penalty": 0.8,
     "presence_penalty": 0.3},
    {"temperature": 0, "repetition_penalty": 1.3},
    {"temperature": 0.8, "seed": 14, "logprobs": 3, "min_tokens": 30, "ignore_eos": False},
    {"temperature": 0, "logit_bias": {"264": 2, "343": -100}, "logprobs": 0},
]


@pytest.mark.parametrize("kw", SAMPLED)
def test_draws_are_the_ones_without_guesses(srv, plain, kw):
    """Each guessed token's row is drawn from as the plain step would: the same generator, the
    adjustments as they stand after the tokens before it, its log-probabilities."""
    base = complete(plain, **kw)["choices"][0]
    pred = predict(base["text"])
    r = complete(srv, prediction=pred, **kw)
    got = r["choices"][0]
    assert got["token_ids"] == base["token_ids"]
    assert got["text"] == base["text"]
    if "logprobs" in kw:
        a, b = got["logprobs"], base["logprobs"]
        assert a["tokens"] == b["tokens"]
        assert a["token_logprobs"] == pytest.approx(b["token_logprobs"], abs=1e-4)
        assert a["top_logprobs"] == b["top_logprobs"] or kw["logprobs"] == 0 or all(
            x.keys() == y.keys() for x, y in zip(a["top_logprobs"], b["top_logprobs"]))
    assert r["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0


def test_several_choices_and_a_stream(srv, plain):
    kw = {"n": 3, "temperature": 0.8, "seed": 5}
    base = complete(plain, **kw)["choices"]
    pred = predict(base[1]["text"])  # right for one choice only
    got = complete(srv, prediction=pred, **kw)["choices"]
    assert [c["token_ids"] for c in got] == [c["token_ids"] for c in base]
    # streamed: the same text, and the usage in the last chunk
    want = complete(plain)["choices"][0]["text"]
    status, _, data = srv.request("POST", "/v1/completions", {
        "prompt": PROMPT, "temperature": 0, "max_tokens": 40, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True}, "logit_bias": TEXT_ONLY,
        "prediction": predict(want)})
    assert status == 200
    chunks = [json.loads(line[6:]) for line in data.decode().splitlines()
              if line.startswith("data: {")]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == want
    assert "completion_tokens_details" in chunks[-1]["usage"]


def test_the_answer_ends_where_it_would(srv, plain):
    """A stop string, the end of generation or max_tokens in the middle of the guesses: the
    answer ends there, the guesses after it are counted rejected."""
    base = complete(plain, max_tokens=40)["choices"][0]
    words = base["text"].split(" ")
    stop = " ".join(words[5:7])
    want = complete(plain, max_tokens=40, stop=[stop])["choices"][0]
    assert want["finish_reason"] == "stop"
    pred = predict(base["text"])
    got = complete(srv, max_tokens=40, stop=[stop], prediction=pred)
    assert got["choices"][0]["text"] == want["text"]
    assert got["choices"][0]["finish_reason"] == "stop"
    d = got["usage"]["completion_tokens_details"]
    assert d["rejected_prediction_tokens"] > 0
    short = complete(srv, max_tokens=7, prediction=pred)
    assert short["choices"][0]["token_ids"] == base["token_ids"][:7]
    assert short["usage"]["completion_tokens"] == 7
    # an end of generation (the model's own) inside the guesses
    free = complete(plain, max_tokens=60, ignore_eos=False, temperature=0.9, seed=3)["choices"][0]
    again = complete(srv, max_tokens=60, ignore_eos=False, temperature=0.9, seed=3,
                     prediction=predict(free["text"] + " more words"))
    assert again["choices"][0]["token_ids"] == free["token_ids"]
    assert again["choices"][0]["finish_reason"] == free["finish_reason"]


def test_a_grammar_constrains_the_guessed_tokens_too(srv, plain):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"]}
    rf = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    for kw in ({"temperature": 0}, {"temperature": 0.9, "seed": 21},
               {"temperature": 0.8, "top_k": 30, "seed": 22}):
        base = complete(plain, response_format=rf, max_tokens=60, ignore_eos=False, **kw)
        text = base["choices"][0]["text"]
        json.loads(text)
        # a guess the grammar forbids is simply not drawn
        for pred in (text, '{"name": "Zed", "age": 7}', "not json at all"):
            r = complete(srv, response_format=rf, max_tokens=60, ignore_eos=False,
                         prediction=predict(pred), **kw)
            assert r["choices"][0]["text"] == text, (kw, pred)


def test_prompt_lookup_guesses_from_the_prompt():
    """--draft-lookup: text the answer copies from the prompt (here the tiny model's own
    answer, repeated in the prompt) is guessed; answers as without."""
    with Server("--cache-mb", "0", "--draft-max", "0") as p:
        first = complete(p, max_tokens=30)["choices"][0]
        prompt = PROMPT + first["text"] + "\n" + PROMPT
        want = complete(p, prompt=prompt, max_tokens=30)["choices"][0]
        other = complete(p, prompt="A different start", max_tokens=30)["choices"][0]
    with Server("--cache-mb", "0", "--draft-lookup") as s:
        before = s.metrics()
        got = complete(s, prompt=prompt, max_tokens=30)
        assert got["choices"][0]["token_ids"] == want["token_ids"]
        after = s.metrics()
        accepted = after["tessera_draft_accepted_total"] - before.get(
            "tessera_draft_accepted_total", 0)
        assert accepted > 0
        assert got["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] == accepted
        assert complete(s, prompt="A different start", max_tokens=30)["choices"][0][
            "token_ids"] == other["token_ids"]


def test_a_continuation_reuses_a_speculated_answer():
    """An answer that ends inside a run of right guesses (here on a stop token) leaves its slot
    rewound to the mark before them: the answer's state kept for a continuation is still whole
    (the idle work runs the rest)."""
    with Server() as s, Server("--cache-mb", "0", "--draft-max", "0") as p:
        ids = s.post_ok("/tokenize", {"content": "In the beginning " * 10})["tokens"]
        body = {"prompt": ids, "max_tokens": 30, "temperature": 0, "return_token_ids": True,
                "ignore_eos": True, "logit_bias": TEXT_ONLY}
        out = p.post_ok("/v1/completions", body)["choices"][0]
        k = next(i for i in range(12, 30) if out["token_ids"][i] not in out["token_ids"][:i])
        body["stop_token_ids"] = [out["token_ids"][k]]
        r = s.post_ok("/v1/completions", dict(body, prediction=predict(out["text"])))
        assert r["choices"][0]["token_ids"] == out["token_ids"][:k + 1]
        assert r["usage"]["completion_tokens_details"]["rejected_prediction_tokens"] > 0
        time.sleep(0.5)  # the answer's state is kept once the worker is idle
        more = {"prompt": ids + out["token_ids"][:k + 1] + [5, 6], "max_tokens": 8,
                "temperature": 0, "return_token_ids": True}
        r2 = s.post_ok("/v1/completions", more)
        assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == len(ids) + k + 1
        assert r2["choices"][0]["token_ids"] == p.post_ok("/v1/completions", more)[
            "choices"][0]["token_ids"]


@pytest.mark.parametrize("pred,why", [
    ("text", "'prediction' must be an object"),
    ({"type": "text", "content": "x"}, "'prediction' must be an object"),
    ({"type": "content"}, "prediction.content must be a string"),
    ({"type": "content", "content": 5}, "prediction.content must be a string"),
    ({"type": "content", "content": [{"type": "image_url", "text": "x"}]},
     "prediction.content[0] must be a text part"),
    ({"type": "content", "content": [{"type": "text", "text": 3}]},
     "prediction.content[0] must be a text part"),
])
def test_a_malformed_prediction_is_refused(srv, pred, why):
    for path, body in (("/v1/completions", {"prompt": "hi"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        status, _, r = srv.post(path, dict(body, prediction=pred))
        assert status == 400, r
        assert r["error"]["param"].startswith("prediction") and why in r["error"]["message"]
