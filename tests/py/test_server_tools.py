"""Tool calling, request side, through the openai client: tools, an assistant tool call and a
tool result are rendered exactly as the Qwen3.5 Jinja template renders them (checked against
transformers' apply_chat_template with the real template text), streaming and not. The tiny
random model never writes a real call, so the output parser is covered by
tests/unit/test_serve_toolcall.c."""
import json
import os

import pytest

from server_util import REPO, Server, fixtures

TEMPLATE = os.path.join(REPO, "..", "shared", "data", "templates", "qwen3.5-4b.jinja")

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"},
                           "days": {"type": "integer", "minimum": 1, "maximum": 7.5}},
            "required": ["city"],
        },
    },
}, {"type": "function", "function": {"name": "now", "description": "The time."}}]

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What's the weather in Paris for 3 days, and the time?"},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}},
        {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"forecast": "sunny"}'},
    {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
]


@pytest.fixture(scope="module")
def srv():
    with Server() as s:
        yield s


def reference_ids(messages, tools, think):
    """The template itself (transformers + jinja2), tokenized with the same tokenizer."""
    if not os.path.exists(TEMPLATE):
        pytest.skip("the shared Qwen3.5 template is not available")
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    path = os.path.join(fixtures(), "tokenizer", "small", "tokenizer.json")
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=path)
    tok.chat_template = open(TEMPLATE).read()
    hf = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):  # the template iterates the arguments as a mapping
            m["tool_calls"] = [{"type": "function", "function": {
                "name": c["function"]["name"],
                "arguments": json.loads(c["function"]["arguments"] or "{}")}}
                for c in m["tool_calls"]]
        hf.append(m)
    text = tok.apply_chat_template(hf, tools=tools, tokenize=False, add_generation_prompt=True,
                                   enable_thinking=think)
    return tokenizers.Tokenizer.from_file(path).encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("think", [False, True])
def test_prompt_matches_the_template(srv, think):
    kw = {"chat_template_kwargs": {"enable_thinking": think}}
    want = reference_ids(CONVERSATION, TOOLS, think)
    st, _, t = srv.post("/tokenize", {"messages": CONVERSATION, "tools": TOOLS, **kw})
    assert st == 200, t
    assert t["tokens"] == want
    c = srv.client()
    r = c.chat.completions.create(model="serve-tiny", messages=CONVERSATION, tools=TOOLS,
                                  max_tokens=4, temperature=0, extra_body=kw)
    assert r.usage.prompt_tokens == len(want)
    assert r.choices[0].finish_reason in ("length", "stop")
    # streaming, tool_choice "auto" and "none" render the same prompt
    for choice in ("auto", "none"):
        chunks = list(c.chat.completions.create(
            model="serve-tiny", messages=CONVERSATION, tools=TOOLS, tool_choice=choice,
            max_tokens=4, temperature=0, stream=True, stream_options={"include_usage": True},
            extra_body=kw))
        assert chunks[-1].usage.prompt_tokens == len(want)


def test_tools_change_the_prompt(srv):
    q = [{"role": "user", "content": "Hi"}]
    st, _, plain = srv.post("/tokenize", {"messages": q})
    st, _, with_tools = srv.post("/tokenize", {"messages": q, "tools": TOOLS})
    assert with_tools["count"] > plain["count"] + 50
    st, _, empty = srv.post("/tokenize", {"messages": q, "tools": []})
    assert empty["tokens"] == plain["tokens"]


def test_tool_results_turn_without_assistant_content(srv):
    # content null next to tool_calls, as the openai client sends it back
    msgs = [CONVERSATION[1], dict(CONVERSATION[2], content=None), CONVERSATION[3]]
    want = reference_ids(msgs, TOOLS, False)
    st, _, t = srv.post("/tokenize", {"messages": msgs, "tools": TOOLS,
                                      "chat_template_kwargs": {"enable_thinking": False}})
    assert st == 200 and t["tokens"] == want


# ---- tool_choice "required" / a named function: the answer is calls, by grammar ----------------

# typed and enumerated parameters: every call's text is finite, so answers end on their own
FORCED = [{
    "type": "function",
    "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"days": {"type": "integer"}, "metric": {"type": "boolean"},
                       "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                       "spots": {"type": "array", "items": {"type": "integer"}, "maxItems": 2}},
        "required": ["days", "unit"]}},
}, {"type": "function", "function": {"name": "now",
                                     "parameters": {"type": "object", "properties": {}}}}]


def check_calls(calls):
    assert calls
    for c in calls:
        args = json.loads(c["function"]["arguments"])
        assert c["function"]["name"] in ("get_weather", "now"), c
        if c["function"]["name"] == "now":
            assert args == {}
        else:
            assert isinstance(args["days"], int) and not isinstance(args["days"], bool)
            assert args["unit"] in ("celsius", "fahrenheit")
            assert isinstance(args.get("metric", True), bool)
            assert all(isinstance(x, int) for x in args.get("spots", []))
            assert set(args) <= {"days", "metric", "unit", "spots"}


@pytest.mark.parametrize("seed", range(6))
def test_tool_choice_required_answers_with_calls(srv, seed):
    st, _, r = srv.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": f"weather? {seed}"}], "tools": FORCED,
        "tool_choice": "required", "max_tokens": 400, "temperature": 1.0, "seed": seed})
    assert st == 200, r
    ch = r["choices"][0]
    assert ch["finish_reason"] == "tool_calls", ch
    assert ch["message"]["content"] is None, ch
    check_calls(ch["message"]["tool_calls"])


def test_named_function_one_call_streamed(srv):
    with srv.client() as c:
        for seed in range(3):
            chunks = list(c.chat.completions.create(
                model="serve-tiny", messages=[{"role": "user", "content": "now?"}],
                tools=FORCED, tool_choice={"type": "function", "function": {"name": "now"}},
                parallel_tool_calls=False, max_tokens=200, temperature=1.0, seed=seed,
                stream=True))
            calls = [tc for ch in chunks if ch.choices and ch.choices[0].delta.tool_calls
                     for tc in ch.choices[0].delta.tool_calls]
            assert len(calls) == 1, calls
            assert calls[0].function.name == "now" and json.loads(calls[0].function.arguments) == {}
            assert chunks[-1].choices[0].finish_reason == "tool_calls" or \
                chunks[-2].choices[0].finish_reason == "tool_calls"
    st, _, r = srv.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "w"}], "tools": FORCED,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False, "max_tokens": 300, "temperature": 0})
    assert st == 200, r
    calls = r["choices"][0]["message"]["tool_calls"]
    assert len(calls) == 1 and calls[0]["function"]["name"] == "get_weather"
    check_calls(calls)
