"""Constrained decoding through `response_format`: with a JSON Schema, every answer that ends
on its own is a JSON text valid against the schema, whatever the draw (greedy, temperature,
top-k / top-p / min-p, penalties), streamed or not, on both routes; JSON mode gives a JSON
object; the reasoning of a thinking answer stays free and only the content follows the grammar;
a request with a grammar beside one without leaves the other's draws as they are alone. The
model is the tiny random one: its answers are gibberish, so whatever structure they have comes
from the grammar."""
import json
import threading

import jsonschema
import pytest

from server_util import Server, chat

# every path through this schema is finite (bounded strings, arrays and enums), so each answer
# ends on its own within max_tokens
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 10},
        "age": {"type": "integer"},
        "mood": {"enum": ["happy", "sad", None, 3]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        "nick": {"type": ["string", "null"], "maxLength": 4},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                 "strict": True}}

DRAWS = [
    {"temperature": 0},
    {"temperature": 1.0, "seed": 1},
    {"temperature": 1.3, "seed": 2},
    {"temperature": 0.8, "top_k": 20, "seed": 3},
    {"temperature": 1.0, "top_p": 0.8, "min_p": 0.02, "seed": 4},
    {"temperature": 0.9, "seed": 5, "repetition_penalty": 1.3, "frequency_penalty": 0.5,
     "presence_penalty": 0.5},
    {"temperature": 1.0, "seed": 6, "logprobs": True, "top_logprobs": 3},
]


@pytest.fixture(scope="module")
def srv():
    with Server() as s:
        yield s


def content_of(r):
    return r["choices"][0]["message"]["content"]


@pytest.mark.parametrize("draw", DRAWS)
def test_schema_answers_validate(srv, draw):
    st, _, r = srv.post("/v1/chat/completions",
                        chat(f"who? {draw}", max_tokens=300, response_format=FORMAT, **draw))
    assert st == 200, r
    assert r["choices"][0]["finish_reason"] == "stop", r
    jsonschema.validate(json.loads(content_of(r)), PERSON)
    if draw.get("logprobs"):
        lps = r["choices"][0]["logprobs"]["content"]
        assert len(lps) == r["usage"]["completion_tokens"]
        assert all(len(x["top_logprobs"]) == 3 and x["logprob"] <= 0 for x in lps)


def test_json_mode_gives_an_object(srv):
    """JSON mode: any JSON object. The strings are unbounded, so an answer may run to
    max_tokens; those that stop parse as objects, and most of them stop."""
    stopped = 0
    for seed in range(8):
        st, _, r = srv.post("/v1/chat/completions",
                            chat(f"json {seed}", max_tokens=500, temperature=1.0, seed=seed,
                                 response_format={"type": "json_object"}))
        assert st == 200, r
        text = content_of(r)
        assert text.lstrip()[:1] == "{", text
        if r["choices"][0]["finish_reason"] == "stop":
            assert isinstance(json.loads(text), dict), text
            stopped += 1
    assert stopped >= 2, stopped


def test_stream_matches_and_completions_route(srv):
    body = chat("stream me", max_tokens=300, temperature=1.0, seed=11, response_format=FORMAT)
    st, _, whole = srv.post("/v1/chat/completions", body)
    assert st == 200, whole
    with srv.client() as c:
        parts = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            model="serve-tiny", stream=True, **{k: v for k, v in body.items()
                                                if k in ("messages", "max_tokens",
                                                         "temperature", "seed")},
            response_format=FORMAT)]
    assert "".join(parts) == content_of(whole)
    st, _, r = srv.post("/v1/completions", {"prompt": "Data:", "max_tokens": 300,
                                            "temperature": 0.7, "seed": 3,
                                            "response_format": FORMAT})
    assert st == 200, r
    assert r["choices"][0]["finish_reason"] == "stop", r
    jsonschema.validate(json.loads(r["choices"][0]["text"]), PERSON)


def test_free_request_beside_a_constrained_one_draws_as_alone():
    """A step with a constrained lane brings every row to the host; the lanes without a
    grammar keep the engine's draws and get the same log-probabilities."""
    free = {"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0.9, "seed": 8,
            "logprobs": 2, "return_token_ids": True, "ignore_eos": True}
    with Server("--parallel", "2", "--cache-mb", "0", "--debug-step-delay-ms", "5") as s:
        st, _, alone = s.post("/v1/completions", free)
        assert st == 200, alone
        out = {}

        def constrained():
            out["c"] = s.post("/v1/completions", {"prompt": "x", "max_tokens": 300,
                                                  "temperature": 1.0, "seed": 1,
                                                  "response_format": FORMAT})

        t = threading.Thread(target=constrained)
        t.start()
        st, _, together = s.post("/v1/completions", free)
        t.join(60)
        assert st == 200, together
        assert out["c"][0] == 200
        a, b = alone["choices"][0], together["choices"][0]
        assert a["token_ids"] == b["token_ids"]
        assert a["text"] == b["text"]
        la, lb = a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"]
        assert max(abs(x - y) for x, y in zip(la, lb)) < 1e-4


def test_reasoning_is_free_and_content_follows(srv):
    """Thinking on: the reasoning is whatever the model writes; once </think> is out, the
    content follows the schema. The random model closes its reasoning now and then: enough
    answers here do that the content side is seen."""
    with_content = free_reasoning = 0
    for seed in range(40):
        st, _, r = srv.post("/v1/chat/completions",
                            chat(f"think {seed}", max_tokens=800, temperature=2.0, seed=seed,
                                 response_format=FORMAT,
                                 chat_template_kwargs={"enable_thinking": True}))
        assert st == 200, r
        msg = r["choices"][0]["message"]
        if msg.get("content"):
            with_content += 1
            if r["choices"][0]["finish_reason"] == "stop":
                jsonschema.validate(json.loads(msg["content"]), PERSON)
            else:
                assert msg["content"].lstrip()[:1] == "{", msg
        reasoning = msg.get("reasoning_content") or ""
        free_reasoning += not reasoning.lstrip().startswith("{")
    assert with_content >= 2, with_content
    assert free_reasoning >= 30, free_reasoning  # gibberish, not JSON


def test_other_servers_fields(srv):
    """llama-server's json_schema and grammar (GBNF), vLLM's guided_json (object or text),
    guided_choice, guided_grammar, guided_regex and structured_outputs constrain the answer the
    same way."""
    import re
    for body in ({"json_schema": PERSON}, {"guided_json": PERSON},
                 {"guided_json": json.dumps(PERSON)}, {"structured_outputs": {"json": PERSON}}):
        st, _, r = srv.post("/v1/chat/completions",
                            chat("x", max_tokens=300, temperature=1.0, seed=4, **body))
        assert st == 200, r
        assert r["choices"][0]["finish_reason"] == "stop", (body, r)
        jsonschema.validate(json.loads(content_of(r)), PERSON)
    zip_code = {"type": "object", "properties": {"zip": {"type": "string",
                                                       "pattern": "^[0-9]{5}(-[0-9]{4})?$"}},
                "required": ["zip"], "additionalProperties": False}
    for seed in range(4):
        st, _, r = srv.post("/v1/chat/completions",
                            chat("zip?", max_tokens=100, temperature=1.0, seed=seed,
                                 json_schema=zip_code))
        assert st == 200 and r["choices"][0]["finish_reason"] == "stop", r
        jsonschema.validate(json.loads(content_of(r)), zip_code)
    ids = {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"},
                                            "host": {"type": "string", "format": "ipv4"}},
           "required": ["id", "host"]}
    for seed in range(3):
        st, _, r = srv.post("/v1/chat/completions", chat("ids?", max_tokens=200, temperature=1.0,
                                                         seed=seed, json_schema=ids))
        assert st == 200 and r["choices"][0]["finish_reason"] == "stop", r
        jsonschema.validate(json.loads(content_of(r)), ids,
                            format_checker=jsonschema.FormatChecker())
    gbnf = 'root ::= ("yes" | "no") " " [0-9]{1,3} ("!" | "")\n'
    regex = "(yes|no) [0-9]{1,3}!?"
    for body in ({"grammar": gbnf}, {"guided_grammar": gbnf},
                 {"structured_outputs": {"grammar": gbnf}}, {"guided_regex": regex},
                 {"structured_outputs": {"regex": regex}}):
        for seed in range(3):
            st, _, r = srv.post("/v1/completions", dict({"prompt": "Answer:", "max_tokens": 50,
                                                         "temperature": 1.0, "seed": seed}, **body))
            assert st == 200, r
            assert re.fullmatch(r"(yes|no) [0-9]{1,3}!?", r["choices"][0]["text"]), r
    choices = ["red", "green", "light blue"]
    seen = set()
    for seed in range(8):
        for body in ({"guided_choice": choices}, {"structured_outputs": {"choice": choices}}):
            st, _, r = srv.post("/v1/chat/completions",
                                chat("colour?", max_tokens=20, temperature=1.5, seed=seed, **body))
            assert st == 200, r
            assert content_of(r) in choices and r["choices"][0]["finish_reason"] == "stop", r
            seen.add(content_of(r))
    assert len(seen) >= 2, seen  # the draw chooses, the grammar only restricts


def test_a_long_run_of_optional_items_answers_promptly(srv):
    """80 optional letters: each position is reached along many paths, and the matcher's
    stacks must merge however they were built (unmerged, 40 such items hung the worker)."""
    import re
    import time
    gbnf = "root ::= " + " ".join(["[a-z]?"] * 80) + "\n"
    t0 = time.time()
    for seed in range(2):
        st, _, r = srv.post("/v1/completions", {"prompt": "x", "max_tokens": 24, "temperature": 1.0,
                                                "seed": seed, "grammar": gbnf}, timeout=120)
        assert st == 200, r
        assert re.fullmatch(r"[a-z]{0,80}", r["choices"][0]["text"]), r
    assert time.time() - t0 < 30


def test_every_choice_follows_the_schema(srv):
    """n choices: each its own copy of the grammar, each answer valid."""
    st, _, r = srv.post("/v1/chat/completions",
                        chat("who? n", max_tokens=300, response_format=FORMAT, n=3,
                             temperature=1.0, seed=21))
    assert st == 200, r
    assert len(r["choices"]) == 3
    for c in r["choices"]:
        assert c["finish_reason"] == "stop", c
        jsonschema.validate(json.loads(c["message"]["content"]), PERSON)
