"""OpenAI's Responses API, POST /v1/responses (docs/API.md, "The Responses API").

The route is a translation: a Responses request is read as the chat request it means, runs as
one, and the answer is rendered in the Responses shape. So most checks send a Responses request
and the equivalent /v1/chat/completions request to the same server (greedy, or one seed) and
compare: the same text, reasoning, tool calls, log-probabilities and token counts. The tiny
random model writes gibberish, deterministically. Its vocabulary (4096) is larger than the
tokenizer's (1033): where texts are compared, ids past 1032 are banned (`logit_bias`, which the
route forwards as a chat extension) so that answers are text."""
import json
import time

import pytest

from server_util import Server

TEXT_ONLY = {str(i): -100 for i in range(1033, 4096)}
END_THINK = 1025  # </think> in the fixtures' small Qwen tokenizer
THINK = {"enable_thinking": True}
MODEL = "serve-tiny"  # the model directory's name (no --alias)

# the same tools in chat's form and in the Responses form (flattened); typed and enumerated
# parameters, so that forced calls are finite
WEATHER_PARAMS = {
    "type": "object",
    "properties": {"days": {"type": "integer"}, "metric": {"type": "boolean"},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["days", "unit"]}
NOW_PARAMS = {"type": "object", "properties": {}}
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather.",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "now", "description": "The time.",
                                      "parameters": NOW_PARAMS}}]
RESP_TOOLS = [
    {"type": "function", "name": "get_weather", "description": "The weather.",
     "parameters": WEATHER_PARAMS},
    {"type": "function", "name": "now", "description": "The time.", "parameters": NOW_PARAMS}]

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
          "required": ["a", "b"], "additionalProperties": False}


@pytest.fixture(scope="module")
def srv():
    with Server() as s:
        yield s


# ---- helpers ---------------------------------------------------------------------------------

def responses(srv, body):
    status, _, r = srv.post("/v1/responses", body)
    assert status == 200, r
    return r


def chat(srv, body):
    status, _, r = srv.post("/v1/chat/completions", body)
    assert status == 200, r
    return r


def greedy(**kw):
    return dict({"temperature": 0, "logit_bias": TEXT_ONLY}, **kw)


def items(r, kind):
    return [o for o in r["output"] if o["type"] == kind]


def text_of(r):
    """The answer's text: the output_text parts of its message items."""
    return "".join(p["text"] for m in items(r, "message") for p in m["content"]
                   if p["type"] == "output_text")


def reasoning_of(r):
    return "".join(p["text"] for m in items(r, "reasoning") for p in m["content"]
                   if p["type"] == "reasoning_text")


def calls_of(r):
    return [(c["name"], c["arguments"]) for c in items(r, "function_call")]


def chat_calls(c):
    return [(t["function"]["name"], t["function"]["arguments"])
            for t in c["choices"][0]["message"].get("tool_calls") or []]


def same_as_chat(r, c):
    """r (a Responses answer) says what c (the chat answer to the equivalent request) says."""
    ch = c["choices"][0]
    msg = ch["message"]
    assert text_of(r) == (msg.get("content") or ""), (r, c)
    assert reasoning_of(r) == (msg.get("reasoning_content") or ""), (r, c)
    assert calls_of(r) == chat_calls(c), (r, c)
    u, cu = r["usage"], c["usage"]
    assert u["input_tokens"] == cu["prompt_tokens"], (u, cu)
    assert u["output_tokens"] == cu["completion_tokens"], (u, cu)
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"] == cu["total_tokens"]
    if ch["finish_reason"] == "length":
        assert r["status"] == "incomplete", r
        assert r["incomplete_details"]["reason"] == "max_output_tokens", r
    else:
        assert r["status"] == "completed", r
        assert r.get("incomplete_details") is None, r
    assert r["error"] is None


def check_shape(r):
    """The envelope and every output item have the documented shape."""
    assert r["object"] == "response"
    assert r["id"].startswith("resp_"), r["id"]
    assert isinstance(r["created_at"], int) and not isinstance(r["created_at"], bool)
    assert r["created_at"] > 1_600_000_000
    assert r["model"] == MODEL
    assert isinstance(r["store"], bool)
    assert r["error"] is None
    assert r["truncation"] == "disabled"
    ids = [o["id"] for o in r["output"]]
    assert len(set(ids)) == len(ids), ids
    for o in r["output"]:
        if o["type"] == "message":
            assert o["id"].startswith("msg_") and o["role"] == "assistant", o
            assert o["status"] in ("completed", "incomplete"), o
            assert o["content"] and all(p["type"] == "output_text" for p in o["content"]), o
            assert all(p["annotations"] == [] for p in o["content"]), o
        elif o["type"] == "reasoning":
            assert o["id"].startswith("rs_") and o["summary"] == [], o
            assert [p["type"] for p in o["content"]] == ["reasoning_text"], o
        elif o["type"] == "function_call":
            assert o["id"].startswith("fc_") and o["call_id"].startswith("call_"), o
            assert o["status"] == "completed", o
            assert isinstance(json.loads(o["arguments"]), dict), o
        else:
            raise AssertionError(f"unexpected output item {o}")
    u = r["usage"]
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"]
    assert 0 <= u["input_tokens_details"]["cached_tokens"] <= u["input_tokens"]
    assert 0 <= u["output_tokens_details"]["reasoning_tokens"] <= u["output_tokens"]


def user(text):
    return [{"role": "user", "content": text}]


# ---- 1. plain text ----------------------------------------------------------------------------

def test_string_input_is_one_user_message(srv):
    """`input` as a string is chat's single user message: the same text and token counts; cut by
    `max_output_tokens` the response is `incomplete` (reason `max_output_tokens`) where chat's
    finish_reason is `length`; ended by a stop string it is `completed`. The envelope and the
    message item have the documented shape (resp_/msg_ ids, store false, error null)."""
    q = "Tell me a story about a cat."
    r = responses(srv, greedy(input=q, max_output_tokens=24))
    c = chat(srv, greedy(messages=user(q), max_tokens=24))
    assert c["choices"][0]["finish_reason"] == "length"
    check_shape(r)
    same_as_chat(r, c)
    assert r["usage"]["output_tokens"] == 24 and r["status"] == "incomplete"
    assert r["max_output_tokens"] == 24
    [m] = items(r, "message")
    assert m["content"][0]["text"] == c["choices"][0]["message"]["content"]
    assert not items(r, "reasoning") and not items(r, "function_call")

    # a stop string taken from the middle of that text ends it early: completed
    text = text_of(r)
    cut = next(i for i in range(len(text) // 2, len(text) - 2) if text[i:i + 2].strip()
               and "\ufffd" not in text[i:i + 2])
    stop = text[cut:cut + 2]
    r2 = responses(srv, greedy(input=q, max_output_tokens=24, stop=[stop]))
    c2 = chat(srv, greedy(messages=user(q), max_tokens=24, stop=[stop]))
    assert c2["choices"][0]["finish_reason"] == "stop"
    check_shape(r2)
    same_as_chat(r2, c2)
    assert r2["status"] == "completed"
    assert text_of(r2) == text[:text.index(stop)]


def test_response_ids_are_unique(srv):
    """Two responses are two ids (and their message items two ids)."""
    a = responses(srv, greedy(input="hi", max_output_tokens=2))
    b = responses(srv, greedy(input="hi", max_output_tokens=2))
    assert a["id"] != b["id"]
    assert items(a, "message")[0]["id"] != items(b, "message")[0]["id"]


def test_settings_are_echoed_and_ignored_fields_accepted(srv):
    """The request's settings come back in the response; the fields the route accepts and ignores
    (`metadata`, `user`, ...) change nothing; `store` (stored by default) is answered."""
    base = greedy(input="Hello there", max_output_tokens=6, instructions="Be kind.",
                  top_p=1, tools=RESP_TOOLS, tool_choice="none", parallel_tool_calls=False,
                  text={"format": {"type": "text"}})
    r = responses(srv, base)
    r2 = responses(srv, dict(base, store=False, metadata={"k": "v"}, user="u1",
                             safety_identifier="s", prompt_cache_key="p", service_tier="auto",
                             stream_options={"include_obfuscation": False},
                             reasoning={"summary": "auto"}, max_tool_calls=2))
    for x in (r, r2):
        check_shape(x)
        assert x["instructions"] == "Be kind."
        assert x["max_output_tokens"] == 6
        assert x["temperature"] == 0
        assert x["top_p"] == 1
        assert x["parallel_tool_calls"] is False
        assert [t["name"] for t in x["tools"]] == ["get_weather", "now"]
        assert x["tool_choice"] == "none"
        assert x["text"]["format"]["type"] == "text"
    assert r["store"] is True and r2["store"] is False
    assert r2["metadata"] == {"k": "v"}
    # the built-in tools' cap: there are none, so it caps nothing, and is echoed
    assert r["max_tool_calls"] is None and r2["max_tool_calls"] == 2
    assert text_of(r2) == text_of(r)
    assert r2["usage"]["input_tokens"] == r["usage"]["input_tokens"]


# ---- 2. instructions --------------------------------------------------------------------------

def test_instructions_are_a_leading_system_message(srv):
    """`instructions` is a system message before `input`: the same text and input tokens as chat
    with that system message (and more input tokens than without it)."""
    sysmsg = "You are a terse assistant who answers in one line."
    r = responses(srv, greedy(instructions=sysmsg, input="What is a cat?", max_output_tokens=12))
    c = chat(srv, greedy(messages=[{"role": "system", "content": sysmsg}] + user("What is a cat?"),
                         max_tokens=12))
    same_as_chat(r, c)
    bare = responses(srv, greedy(input="What is a cat?", max_output_tokens=12))
    assert bare["usage"]["input_tokens"] < r["usage"]["input_tokens"]


# ---- 3. item lists ----------------------------------------------------------------------------

def test_item_list_is_the_chat_conversation(srv):
    """Message items (`type` given or left out) with string content or input_text / output_text
    parts, an assistant turn and a `developer` message read as chat's conversation, `developer`
    being `system`."""
    inp = [
        {"role": "developer", "content": "Answer briefly."},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Name a colour"},
                     {"type": "input_text", "text": " and a fruit."}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Red, apple.", "annotations": []}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Another?"}]},
    ]
    msgs = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "text", "text": "Name a colour"},
                                     {"type": "text", "text": " and a fruit."}]},
        {"role": "assistant", "content": "Red, apple."},
        {"role": "user", "content": "Another?"},
    ]
    r = responses(srv, greedy(input=inp, max_output_tokens=10))
    c = chat(srv, greedy(messages=msgs, max_tokens=10))
    check_shape(r)
    same_as_chat(r, c)
    # developer == system, in the Responses form too
    inp_sys = [dict(inp[0], role="system")] + inp[1:]
    r_sys = responses(srv, greedy(input=inp_sys, max_output_tokens=10))
    assert text_of(r_sys) == text_of(r)
    assert r_sys["usage"]["input_tokens"] == r["usage"]["input_tokens"]
    # an assistant's refusal part (OpenAI's form: the text under "refusal") is its text too
    inp_ref = inp[:2] + [{"type": "message", "role": "assistant",
                          "content": [{"type": "refusal", "refusal": "Red, apple."}]}] + inp[3:]
    r_ref = responses(srv, greedy(input=inp_ref, max_output_tokens=10))
    assert text_of(r_ref) == text_of(r)
    assert r_ref["usage"]["input_tokens"] == r["usage"]["input_tokens"]


def test_string_input_equals_one_user_item(srv):
    """A string `input` and a list holding one user message item are the same request."""
    a = responses(srv, greedy(input="Good morning", max_output_tokens=8))
    b = responses(srv, greedy(input=[{"role": "user", "content": "Good morning"}],
                              max_output_tokens=8))
    c = responses(srv, greedy(input=[{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "Good morning"}]}], max_output_tokens=8))
    assert text_of(a) == text_of(b) == text_of(c)
    assert a["usage"]["input_tokens"] == b["usage"]["input_tokens"] == c["usage"]["input_tokens"]


# ---- 4. tool calls ----------------------------------------------------------------------------

@pytest.mark.parametrize("choice,parallel", [
    ("required", None),
    ("required", False),
    ({"type": "function", "name": "get_weather"}, None),
])
def test_forced_tool_calls_match_chat(srv, choice, parallel):
    """Tools in the flattened Responses form and `tool_choice` `required` or a named function
    give function_call items (fc_ ids, call_ ids, the name, the arguments as a JSON string) equal
    to chat's tool_calls for the chat form of the same tools and choice; the prompt is the same
    (input tokens), and a call-only answer has no message text."""
    chat_choice = choice if isinstance(choice, str) else \
        {"type": "function", "function": {"name": choice["name"]}}
    extra = {} if parallel is None else {"parallel_tool_calls": parallel}
    q = user("What is the weather for the next days, and the time?")
    r = responses(srv, dict(input=q, tools=RESP_TOOLS, tool_choice=choice, temperature=0,
                            max_output_tokens=300, **extra))
    c = chat(srv, dict(messages=q, tools=CHAT_TOOLS, tool_choice=chat_choice, temperature=0,
                       max_tokens=300, **extra))
    assert c["choices"][0]["finish_reason"] == "tool_calls"
    check_shape(r)
    same_as_chat(r, c)
    assert r["status"] == "completed"
    calls = items(r, "function_call")
    assert calls and not text_of(r)
    if parallel is False:
        assert len(calls) == 1
    if isinstance(choice, dict):
        assert all(x["name"] == "get_weather" for x in calls)
        args = json.loads(calls[0]["arguments"])
        assert isinstance(args["days"], int) and args["unit"] in ("celsius", "fahrenheit")
    assert len({x["call_id"] for x in calls}) == len(calls)
    assert r["tool_choice"] == choice


def test_tool_results_turn_matches_chat(srv):
    """A follow-up turn that sends back the answer's function_call items and a
    function_call_output item for each is chat's assistant tool_calls message followed by
    `tool` messages: the same prompt (input tokens) and the same answer. A tool output given as
    input_text parts is the same as that text as a string."""
    q = user("What is the weather in three days, and the time?")
    first = responses(srv, dict(input=q, tools=RESP_TOOLS, tool_choice="required",
                                temperature=0, max_output_tokens=300))
    calls = items(first, "function_call")
    assert calls
    results = [f"result {k}: sunny" for k in range(len(calls))]

    def outputs(as_parts):
        return [{"type": "function_call_output", "call_id": fc["call_id"],
                 "output": [{"type": "input_text", "text": res}] if as_parts else res}
                for fc, res in zip(calls, results)]

    inp = q + calls + outputs(False)  # the items sent back as they came
    msgs = q + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": fc["call_id"], "type": "function",
         "function": {"name": fc["name"], "arguments": fc["arguments"]}} for fc in calls]}] + [
        {"role": "tool", "tool_call_id": fc["call_id"], "content": res}
        for fc, res in zip(calls, results)]
    r = responses(srv, greedy(input=inp, tools=RESP_TOOLS, max_output_tokens=12))
    c = chat(srv, greedy(messages=msgs, tools=CHAT_TOOLS, max_tokens=12))
    check_shape(r)
    same_as_chat(r, c)
    assert r["usage"]["input_tokens"] > first["usage"]["input_tokens"]
    # only the fields a client must send: call_id, name, arguments
    slim = q + [{"type": "function_call", "call_id": fc["call_id"], "name": fc["name"],
                 "arguments": fc["arguments"]} for fc in calls] + outputs(True)
    r2 = responses(srv, greedy(input=slim, tools=RESP_TOOLS, max_output_tokens=12))
    assert text_of(r2) == text_of(r)
    assert r2["usage"]["input_tokens"] == r["usage"]["input_tokens"]


def test_reasoning_item_is_the_next_assistant_turns_reasoning(srv):
    """A `reasoning` item before a function_call is the reasoning of that assistant turn (chat's
    reasoning_content), kept by the template after the last user message: the same prompt and
    answer as chat; a reasoning item with only `summary` texts reads the same."""
    q = user("What time is it?")
    call = {"type": "function_call", "call_id": "call_abc", "name": "now", "arguments": "{}"}
    out = {"type": "function_call_output", "call_id": "call_abc", "output": "12:00"}
    thought = "I should ask the clock."
    rs = {"type": "reasoning", "id": "rs_1", "summary": [],
          "content": [{"type": "reasoning_text", "text": thought}]}
    rs_summary = {"type": "reasoning", "id": "rs_1",
                  "summary": [{"type": "summary_text", "text": thought}]}
    msgs = q + [{"role": "assistant", "content": None, "reasoning_content": thought,
                 "tool_calls": [{"id": "call_abc", "type": "function",
                                 "function": {"name": "now", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_abc", "content": "12:00"}]
    r = responses(srv, greedy(input=q + [rs, call, out], tools=RESP_TOOLS, max_output_tokens=10))
    c = chat(srv, greedy(messages=msgs, tools=CHAT_TOOLS, max_tokens=10))
    same_as_chat(r, c)
    without = responses(srv, greedy(input=q + [call, out], tools=RESP_TOOLS,
                                    max_output_tokens=10))
    assert without["usage"]["input_tokens"] < r["usage"]["input_tokens"]
    r2 = responses(srv, greedy(input=q + [rs_summary, call, out], tools=RESP_TOOLS,
                               max_output_tokens=10))
    assert text_of(r2) == text_of(r)
    assert r2["usage"]["input_tokens"] == r["usage"]["input_tokens"]


# ---- 5. reasoning -----------------------------------------------------------------------------

def test_thinking_answer_is_a_reasoning_item(srv):
    """With thinking on the answer starts as reasoning: a `reasoning` item whose reasoning_text
    is chat's reasoning_content, with reasoning_tokens counted (> 0, <= output_tokens; all of
    them when the length cut the answer inside the thinking)."""
    q = user("Tell me a story.")
    r = responses(srv, greedy(input=q, max_output_tokens=16, chat_template_kwargs=THINK))
    c = chat(srv, greedy(messages=q, max_tokens=16, chat_template_kwargs=THINK))
    check_shape(r)
    same_as_chat(r, c)
    assert c["choices"][0]["message"].get("reasoning_content")
    [rs] = items(r, "reasoning")
    assert rs["content"][0]["text"] == c["choices"][0]["message"]["reasoning_content"]
    assert r["output"][0]["type"] == "reasoning"
    u = r["usage"]
    assert 0 < u["output_tokens_details"]["reasoning_tokens"] <= u["output_tokens"]
    ch = c["choices"][0]
    if not ch["message"].get("content") and ch["finish_reason"] == "length":
        # every token of the answer was inside the thinking (the last maybe its </think>)
        assert u["output_tokens_details"]["reasoning_tokens"] >= u["output_tokens"] - 1


@pytest.mark.parametrize("seed", range(6))
def test_reasoning_then_text_matches_chat(srv, seed):
    """Sampled (one seed) with </think> favoured, so that some answers leave the thinking: the
    reasoning item, the message item and their order, the status and the token counts match
    chat's answer to the same request; reasoning_tokens counts some but not all tokens when both
    channels have text."""
    lb = dict(TEXT_ONLY, **{str(END_THINK): 2})
    q = user("Tell me a story.")
    kw = dict(temperature=0.5, seed=seed, logit_bias=lb, chat_template_kwargs=THINK)
    r = responses(srv, dict(input=q, max_output_tokens=24, **kw))
    c = chat(srv, dict(messages=q, max_tokens=24, **kw))
    check_shape(r)
    same_as_chat(r, c)
    msg = c["choices"][0]["message"]
    u = r["usage"]
    rt = u["output_tokens_details"]["reasoning_tokens"]
    if msg.get("reasoning_content"):
        assert 0 < rt <= u["output_tokens"]
        assert r["output"][0]["type"] == "reasoning"
    if msg.get("reasoning_content") and msg.get("content"):
        assert [o["type"] for o in r["output"]] == ["reasoning", "message"]
        assert rt < u["output_tokens"]
    if not msg.get("reasoning_content"):
        assert not items(r, "reasoning")


def test_some_seed_gives_both_channels(srv):
    """The parametrised test above covers an answer with reasoning and text, and one that ends
    inside the thinking (so that its checks are not vacuous)."""
    lb = dict(TEXT_ONLY, **{str(END_THINK): 2})
    kinds = set()
    for seed in range(6):
        c = chat(srv, dict(messages=user("Tell me a story."), max_tokens=24, temperature=0.5,
                           seed=seed, logit_bias=lb, chat_template_kwargs=THINK))
        m = c["choices"][0]["message"]
        kinds.add((bool(m.get("reasoning_content")), bool(m.get("content"))))
    assert (True, True) in kinds and (True, False) in kinds, kinds


@pytest.mark.parametrize("effort", ["none", "low", "high"])
@pytest.mark.parametrize("think", [True, None])
def test_reasoning_effort_is_chats(srv, effort, think):
    """`reasoning.effort` is chat's `reasoning_effort` (with and without enable_thinking): the
    same prompt, reasoning and text as chat; reasoning_tokens 0 when there is no reasoning item;
    the setting echoed. (A bad effort is refused with param `reasoning.effort`, see the
    refusals: the field does reach chat's check.)"""
    q = user("Tell me a story.")
    kw = {"chat_template_kwargs": THINK} if think else {}
    r = responses(srv, greedy(input=q, max_output_tokens=12, reasoning={"effort": effort}, **kw))
    c = chat(srv, greedy(messages=q, max_tokens=12, reasoning_effort=effort, **kw))
    check_shape(r)
    same_as_chat(r, c)
    assert r["reasoning"]["effort"] == effort
    if not items(r, "reasoning"):
        assert r["usage"]["output_tokens_details"]["reasoning_tokens"] == 0
    # minimal..high leave the choice to enable_thinking
    if effort != "none":
        plain = responses(srv, greedy(input=q, max_output_tokens=12, **kw))
        assert normal(plain)["output"] == normal(r)["output"]
        assert normal(plain["usage"]) == normal(r["usage"])


def test_an_explicit_enable_thinking_wins_over_reasoning_effort(srv):
    """As in chat (docs/API.md, Fields): `reasoning.effort: "none"` turns thinking off unless
    chat_template_kwargs.enable_thinking says otherwise - the explicit switch wins."""
    q = user("Tell me a story.")
    r = responses(srv, greedy(input=q, max_output_tokens=12, reasoning={"effort": "none"},
                              chat_template_kwargs=THINK))
    on = responses(srv, greedy(input=q, max_output_tokens=12, chat_template_kwargs=THINK))
    assert r["usage"]["input_tokens"] == on["usage"]["input_tokens"]
    assert r["output"] == on["output"] or [i["type"] for i in r["output"]] == \
        [i["type"] for i in on["output"]]
    off = responses(srv, greedy(input=q, max_output_tokens=12, reasoning={"effort": "none"},
                                chat_template_kwargs={"enable_thinking": False}))
    assert not items(off, "reasoning")
    assert off["usage"]["output_tokens_details"]["reasoning_tokens"] == 0


# ---- 6. structured output ---------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["json_schema", "json_object"])
def test_text_format_is_response_format(srv, fmt):
    """`text.format` (flattened) is chat's `response_format`: the same text, which parses as
    JSON (an object with the schema's keys for json_schema)."""
    q = user("Give me some JSON.")
    if fmt == "json_schema":
        rf = {"type": "json_schema", "name": "x", "schema": SCHEMA, "strict": True}
        cf = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA,
                                                     "strict": True}}
    else:
        rf = cf = {"type": "json_object"}
    r = responses(srv, greedy(input=q, max_output_tokens=200, text={"format": rf}))
    c = chat(srv, greedy(messages=q, max_tokens=200, response_format=cf))
    check_shape(r)
    same_as_chat(r, c)
    if fmt == "json_schema":  # finite: the answer ends, and is JSON of the schema
        assert c["choices"][0]["finish_reason"] == "stop", c
        v = json.loads(text_of(r))
        assert set(v) == {"a", "b"} and isinstance(v["a"], int) and isinstance(v["b"], bool)
    elif c["choices"][0]["finish_reason"] == "stop":  # free keys may not end in 200 tokens
        assert isinstance(json.loads(text_of(r)), dict)
    else:  # cut: still the start of an object
        assert text_of(r).lstrip().startswith("{")
    assert r["text"]["format"]["type"] == fmt


# ---- 7. streaming -----------------------------------------------------------------------------

def sse(srv, body):
    """Posts a streaming request; returns [(event, data)] and checks the framing: an `event:`
    line naming the data's `type`, no `[DONE]`."""
    st, hd, data = srv.request("POST", "/v1/responses", dict(body, stream=True))
    assert st == 200, data
    assert hd["content-type"].startswith("text/event-stream"), hd
    text = data.decode()
    assert not any(line.strip() == "data: [DONE]" for line in text.splitlines())
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        ev, payload = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                ev = line[len("event:"):].strip()
            elif line.startswith("data:"):
                payload.append(line[len("data:"):].strip())
        assert ev is not None and payload, block
        d = json.loads("\n".join(payload))
        assert d["type"] == ev, block
        events.append((ev, d))
    return events


VOLATILE = {"id", "call_id", "item_id", "created_at", "completed_at", "cached_tokens"}


def normal(x):
    """A response without what differs between two runs of one request (ids, times, the prompt
    tokens found in the cache)."""
    if isinstance(x, dict):
        return {k: normal(v) for k, v in x.items() if k not in VOLATILE}
    if isinstance(x, list):
        return [normal(v) for v in x]
    return x


def check_stream(events, want):
    """The event sequence of docs/API.md, and a final response equal to `want`, the
    non-streaming answer to the same request, apart from ids and times."""
    types = [e for e, _ in events]
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert types[-1] in ("response.completed", "response.incomplete"), types
    assert "response.failed" not in types and "error" not in types, types
    final = events[-1][1]["response"]
    assert types[-1] == "response." + final["status"]
    created = events[0][1]["response"]
    assert created["status"] == "in_progress" and created["id"] == final["id"]
    assert events[1][1]["response"]["id"] == final["id"]
    check_shape(final)
    assert normal(final) == normal(want)

    added = [d for e, d in events if e == "response.output_item.added"]
    done = [d for e, d in events if e == "response.output_item.done"]
    assert [d["output_index"] for d in added] == list(range(len(final["output"])))
    assert [d["output_index"] for d in done] == list(range(len(final["output"])))
    for i, item in enumerate(final["output"]):
        # an item's events lie between its added and its done
        a = next(k for k, (e, d) in enumerate(events)
                 if e == "response.output_item.added" and d["output_index"] == i)
        z = next(k for k, (e, d) in enumerate(events)
                 if e == "response.output_item.done" and d["output_index"] == i)
        assert a < z
        assert events[a][1]["item"]["id"] == item["id"] and events[a][1]["item"]["type"] == \
            item["type"]
        assert events[z][1]["item"] == item
        mine = [(e, d) for e, d in events if d.get("output_index") == i]
        assert all(a <= k <= z for k, (e, d) in enumerate(events) if d.get("output_index") == i)
        if item["type"] in ("message", "reasoning"):
            kind = "output_text" if item["type"] == "message" else "reasoning_text"
            deltas = [d for e, d in mine if e == f"response.{kind}.delta"]
            dones = [d for e, d in mine if e == f"response.{kind}.done"]
            assert all(d["item_id"] == item["id"] and d["content_index"] == 0 for d in deltas)
            assert len(dones) == 1 and dones[0]["item_id"] == item["id"]
            assert "".join(d["delta"] for d in deltas) == dones[0]["text"] == \
                item["content"][0]["text"]
            part_types = [e for e, _ in mine if e.startswith("response.content_part.")]
            assert part_types == ["response.content_part.added", "response.content_part.done"]
            if item["type"] == "message" and "logprobs" in item["content"][0]:
                lps = [x for d in deltas for x in d.get("logprobs") or []]
                assert lps == item["content"][0]["logprobs"]
        else:
            args = [d for e, d in mine if e == "response.function_call_arguments.done"]
            assert len(args) == 1 and args[0]["arguments"] == item["arguments"]
            assert "".join(d["delta"] for e, d in mine
                           if e == "response.function_call_arguments.delta") == item["arguments"]
    return final


STREAMED = {
    "text": greedy(input="Tell me a story about a dog.", max_output_tokens=12),
    "text_stopped": None,  # "text" with a stop string taken from its answer (below)
    "thinking": dict(input="Tell me a story.", max_output_tokens=24, temperature=0.5, seed=0,
                     logit_bias=dict(TEXT_ONLY, **{str(END_THINK): 2}),
                     chat_template_kwargs=THINK),
    "tool_call": dict(input="weather?", tools=RESP_TOOLS, temperature=0, max_output_tokens=300,
                      tool_choice={"type": "function", "name": "get_weather"}),
    "logprobs": greedy(input="Tell me a story about a dog.", max_output_tokens=6,
                       top_logprobs=2, include=["message.output_text.logprobs"]),
    # ends at <|im_end|> (1002), a token with no text whose log-probability still goes out
    "logprobs_end": greedy(input="Tell me a story about a dog.", max_output_tokens=6,
                           top_logprobs=2, include=["message.output_text.logprobs"],
                           min_tokens=3, logit_bias=dict(TEXT_ONLY, **{"1002": 100})),
}


@pytest.mark.parametrize("case", list(STREAMED))
def test_stream_matches_the_answer(srv, case):
    """A streamed response is the non-streaming one told as events: response.created and
    .in_progress first, consecutive sequence numbers, each item's added / deltas / done, the text
    and reasoning deltas adding up to the .done texts and the item, a function call's arguments
    whole, and a final response.completed / .incomplete carrying the same response."""
    if case == "text_stopped":
        body = dict(STREAMED["text"])
        text = text_of(responses(srv, body))
        cut = next(i for i in range(len(text) // 2, len(text) - 2) if text[i:i + 2].strip()
                   and "\ufffd" not in text[i:i + 2])
        body["stop"] = [text[cut:cut + 2]]
    else:
        body = dict(STREAMED[case])
    want = responses(srv, body)
    final = check_stream(sse(srv, body), want)
    if case == "text":
        assert final["status"] == "incomplete" and text_of(final)
    if case == "text_stopped":
        assert final["status"] == "completed"
    if case == "thinking":
        assert items(final, "reasoning") and items(final, "message")
    if case == "tool_call":
        assert calls_of(final) == calls_of(want) and calls_of(final)
    if case == "logprobs":
        assert len(items(final, "message")[0]["content"][0]["logprobs"]) == 6
    if case == "logprobs_end":
        assert final["status"] == "completed"
        lps = items(final, "message")[0]["content"][0]["logprobs"]
        assert len(lps) == 4 and lps[-1]["token"] == "<|im_end|>"


def test_stream_failure_is_not_a_done_line(srv):
    """A refused streaming request is a plain JSON error (the checks come before the stream)."""
    st, hd, data = srv.request("POST", "/v1/responses",
                               {"input": "x", "stream": True, "temperature": 7})
    assert st == 400 and hd["content-type"].startswith("application/json")
    assert json.loads(data)["error"]["param"] == "temperature"


# ---- 8. the openai SDK ------------------------------------------------------------------------

def sdk_client(srv):
    openai = pytest.importorskip("openai")
    c = srv.client()
    if not hasattr(c, "responses"):
        pytest.skip(f"openai {openai.__version__} has no client.responses")
    return c


def test_sdk_responses_create(srv):
    """The openai library's client.responses.create reads the answer: its output_text is the raw
    route's text, its usage the raw route's."""
    c = sdk_client(srv)
    q = "Write a haiku about rain."
    raw_r = responses(srv, greedy(input=q, max_output_tokens=8))
    r = c.responses.create(model=MODEL, input=q, max_output_tokens=8, temperature=0,
                           extra_body={"logit_bias": TEXT_ONLY})
    assert r.output_text == text_of(raw_r)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.input_tokens == raw_r["usage"]["input_tokens"]
    assert r.usage.output_tokens == 8
    # and with a system prompt and a message list
    r2 = c.responses.create(model=MODEL, instructions="Be brief.",
                            input=[{"role": "user", "content": q}], max_output_tokens=8,
                            temperature=0, extra_body={"logit_bias": TEXT_ONLY})
    raw2 = responses(srv, greedy(instructions="Be brief.", input=q, max_output_tokens=8))
    assert r2.output_text == text_of(raw2)


def test_sdk_responses_stream(srv):
    """client.responses.create(stream=True) parses every event and ends with
    response.completed / response.incomplete holding the same text as the deltas."""
    c = sdk_client(srv)
    q = "Write a haiku about rain."
    events = list(c.responses.create(model=MODEL, input=q, max_output_tokens=8, temperature=0,
                                     stream=True, extra_body={"logit_bias": TEXT_ONLY}))
    assert events[0].type == "response.created"
    assert events[-1].type in ("response.completed", "response.incomplete")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-1].response.output_text
    assert deltas == text_of(responses(srv, greedy(input=q, max_output_tokens=8)))
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_sdk_tool_call(srv):
    """The library parses function_call items (and sends them back as input on the next turn)."""
    c = sdk_client(srv)
    r = c.responses.create(model=MODEL, input="weather?", tools=RESP_TOOLS, temperature=0,
                           tool_choice={"type": "function", "name": "now"},
                           max_output_tokens=200)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "now" and json.loads(calls[0].arguments) == {}
    follow = c.responses.create(
        model=MODEL, tools=RESP_TOOLS, temperature=0, max_output_tokens=4,
        input=[{"role": "user", "content": "weather?"},
               *[x.model_dump(exclude_none=True) for x in calls],
               *[{"type": "function_call_output", "call_id": x.call_id, "output": "12:00"}
                 for x in calls]])
    assert follow.usage.input_tokens > r.usage.input_tokens


# ---- 9. logprobs ------------------------------------------------------------------------------

def test_logprobs_are_chats(srv):
    """`top_logprobs` with include message.output_text.logprobs puts chat's logprobs entries on
    the output_text part: the same tokens, log-probabilities and alternatives."""
    q = user("Tell me a story about a fox.")
    r = responses(srv, greedy(input=q, max_output_tokens=6, top_logprobs=2,
                              include=["message.output_text.logprobs"]))
    c = chat(srv, greedy(messages=q, max_tokens=6, logprobs=True, top_logprobs=2))
    same_as_chat(r, c)
    got = items(r, "message")[0]["content"][0]["logprobs"]
    want = c["choices"][0]["logprobs"]["content"]
    assert len(got) == len(want) == 6
    for g, w in zip(got, want):
        assert g["token"] == w["token"]
        assert g["logprob"] == w["logprob"]
        assert [(t["token"], t["logprob"]) for t in g["top_logprobs"]] == \
            [(t["token"], t["logprob"]) for t in w["top_logprobs"]]
        assert len(g["top_logprobs"]) == 2


# ---- 10. refusals -----------------------------------------------------------------------------

GOOD = {"input": "hi", "max_output_tokens": 2, "temperature": 0}
IMG_BAD = {"type": "input_image", "image_url": "data:nope"}


def starts(prefix):
    return lambda p: isinstance(p, str) and p.startswith(prefix)


REFUSED = [
    ("no_input", {"max_output_tokens": 2}, "invalid_value", "input"),
    ("input_number", {"input": 5}, "invalid_value", "input"),
    ("input_null_items", {"input": [5]}, "invalid_value", starts("input[0]")),
    ("item_unknown_type", {"input": [{"type": "bogus", "role": "user", "content": "x"}]},
     None, starts("input[0]")),
    ("item_reference", {"input": [{"type": "item_reference", "id": "msg_1"}]},
     "unsupported_feature", starts("input[0]")),
    ("input_file_part", {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "x"}, {"type": "input_file", "file_id": "f"}]}]},
     "unsupported_feature", starts("input[0]")),
    ("previous_response_id", dict(GOOD, previous_response_id="resp_123"),
     "previous_response_not_found", "previous_response_id"),
    ("previous_response_id_type", dict(GOOD, previous_response_id=5), "invalid_value",
     "previous_response_id"),
    ("store_type", dict(GOOD, store="yes"), "invalid_value", "store"),
    ("conversation", dict(GOOD, conversation="conv_1"), "unsupported_feature", "conversation"),
    ("background", dict(GOOD, background=True), "unsupported_feature", "background"),
    ("truncation_unknown", dict(GOOD, truncation="middle"), "invalid_value", "truncation"),
    ("max_tool_calls_type", dict(GOOD, max_tool_calls="3"), "invalid_value", "max_tool_calls"),
    ("max_tool_calls_neg", dict(GOOD, max_tool_calls=-1), "invalid_value", "max_tool_calls"),
    ("web_search_tool", dict(GOOD, tools=[{"type": "web_search"}]),
     "unsupported_feature", "tools[0].type"),
    ("max_output_tokens_0", dict(GOOD, max_output_tokens=0), "invalid_value", "max_output_tokens"),
    ("max_output_tokens_neg", dict(GOOD, max_output_tokens=-1), "invalid_value",
     "max_output_tokens"),
    ("temperature", dict(GOOD, temperature=5), "invalid_value", "temperature"),
    ("image_bad_url", {"input": [{"role": "user", "content": "look"},
                                 {"role": "user", "content": [IMG_BAD]}]},
     "invalid_value", starts("input[1]")),
    ("image_bad_url_after_instructions",  # instructions shift chat's indices, not input's
     {"instructions": "sys", "input": [{"role": "user", "content": "look"},
                                       {"role": "user", "content": [
                                           {"type": "input_text", "text": "this"}, IMG_BAD]}]},
     "invalid_value", starts("input[1]")),
    ("text_format_unknown", dict(GOOD, text={"format": {"type": "xml"}}), "invalid_value",
     starts("text.format")),
    ("reasoning_effort_unknown", dict(GOOD, reasoning={"effort": "extreme"}), "invalid_value",
     "reasoning.effort"),
    ("tool_choice_unknown_name", dict(GOOD, tools=RESP_TOOLS,
                                      tool_choice={"type": "function", "name": "nope"}),
     "invalid_value", "tool_choice.name"),
    ("instructions_number", dict(GOOD, instructions=3), "invalid_value", "instructions"),
]


@pytest.mark.parametrize("name,body,code,param", REFUSED, ids=[x[0] for x in REFUSED])
def test_refusals(srv, name, body, code, param):
    """Each refusal is a 400 with the error envelope, its code, and a param naming the Responses
    field (a chat-level check mapped back to `input[i]...`, `max_output_tokens`,
    `text.format`, ...)."""
    st, hd, r = srv.post("/v1/responses", body)
    assert st == 400, (st, r)
    e = r["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    assert e["type"] == "invalid_request_error" and e["message"], e
    if code is None:
        assert e["code"] in ("invalid_value", "unsupported_feature"), e
    else:
        assert e["code"] == code, e
    if callable(param):
        assert param(e["param"]), e
    else:
        assert e["param"] == param, e


def test_serves_after_refusals(srv):
    """Refused requests leave the server answering: a good request after a run of refusals."""
    for _, body, _, _ in REFUSED[:6]:
        st, _, _ = srv.post("/v1/responses", body)
        assert st == 400
    r = responses(srv, greedy(input="Still there?", max_output_tokens=4))
    check_shape(r)
    assert r["usage"]["output_tokens"] == 4


# ---- 11. prefix reuse -------------------------------------------------------------------------


def test_follow_up_reuses_the_prefix():
    """Stateless, but a follow-up that sends the conversation back (turn 1, its answer as an
    assistant output_text item, a new user message) prefills only its new part: its
    cached_tokens cover the first turn. A server of its own: the module's server may still have
    other answers' next turns to prepare, which would make the wait below ambiguous."""
    with Server() as srv:
        follow_up(srv)


def follow_up(srv):
    instructions = "You are a helpful assistant. " + "Remember these facts carefully. " * 40
    q1 = user("What is the capital of France?")
    before = srv.next_turns()
    r1 = responses(srv, greedy(instructions=instructions, input=q1, max_output_tokens=12))
    assert r1["usage"]["input_tokens_details"]["cached_tokens"] < r1["usage"]["input_tokens"]
    answer = text_of(r1).replace("\x00", "")
    srv.wait_next_turn(before)
    inp = q1 + [{"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": answer, "annotations": []}]},
                {"role": "user", "content": "And of Italy?"}]
    r2 = responses(srv, greedy(instructions=instructions, input=inp, max_output_tokens=12))
    cached = r2["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached > 0
    assert cached >= r1["usage"]["input_tokens"] - 16, (cached, r1["usage"])
    assert cached < r2["usage"]["input_tokens"]


@pytest.mark.parametrize("role", ["messages[1].tool_calls[0", "messages[1].tool_calls[0]",
                                  "messages[99]", "messages[1].tool_calls[7]"])
def test_client_text_quoted_in_an_error_is_not_a_name_to_rename(srv, role):
    """Chat's refusals quote the client's text (here an unknown role), which the renaming
    into the Responses fields scans too: text that looks like a chat name - half of one, or
    one naming a message or call that does not exist - is renamed or left, never read past."""
    status, _, e = srv.post("/v1/responses", {"input": [
        {"role": "user", "content": "a"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"role": role, "content": "x"}]})
    assert status == 400 and e["error"]["code"] == "invalid_role", e
    assert e["error"]["param"] == "input[2].role"
    assert srv.post("/v1/responses", {"input": "x", "max_output_tokens": 1})[0] == 200


def test_a_stream_cut_by_shutdown_ends_failed():
    """A failure after the stream started (here the drain deadline of a SIGTERM passing) is an
    `error` event and then `response.failed` carrying the error - no `[DONE]`, no
    `response.completed` - and the server still exits 0."""
    import signal
    s = Server("--debug-step-delay-ms", "20", "--drain-ms", "300")
    try:
        holder = {}

        def read():
            holder["r"] = s.request("POST", "/v1/responses",
                                    {"input": "x", "max_output_tokens": 3000, "stream": True},
                                    timeout=30)

        import threading
        t = threading.Thread(target=read)
        t.start()
        time.sleep(1.0)  # decoding, some deltas out
        s.proc.send_signal(signal.SIGTERM)
        t.join(30)
        st, _, data = holder["r"]
        assert st == 200
        blocks = [b for b in data.decode().split("\n\n") if b.strip()]
        types = [b.split("\n")[0][len("event: "):] for b in blocks]
        assert types[0] == "response.created" and "response.completed" not in types
        assert types[-2:] == ["error", "response.failed"], types[-3:]
        err = json.loads(blocks[-2].split("\n", 1)[1][len("data: "):])
        failed = json.loads(blocks[-1].split("\n", 1)[1][len("data: "):])
        assert err["code"] == "server_shutting_down"
        assert failed["response"]["status"] == "failed"
        assert failed["response"]["error"]["code"] == "server_shutting_down"
        seq = [json.loads(b.split("\n", 1)[1][len("data: "):])["sequence_number"] for b in blocks]
        assert seq == list(range(len(blocks)))
        assert s.proc.wait(10) == 0
    finally:
        s.stop()


# ---- 12. truncation "auto" --------------------------------------------------------------------

TRUNC_CTX = 1024


def long_conversation():
    """Turns of a conversation, each a list of items starting with its user message; the first
    has a tool call and its output (a unit with the question before it), the last is the
    question to answer."""
    filler = "Tell me about the sea, the sky and the long road home. "
    turns = [[{"role": "user", "content": f"Turn {i}: " + filler * 2},
              {"role": "assistant", "content": f"Answer {i}: the sea is wide and deep."}]
             for i in range(6)]
    turns[0][1:1] = [
        {"type": "function_call", "call_id": "call_0", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_0", "output": "sunny"}]
    turns.append([{"role": "user", "content": "And now, what next?"}])
    return turns


def test_truncation_auto_drops_the_oldest_turns():
    """With truncation "auto" a conversation longer than the context loses its oldest turns -
    whole: a user message with the calls, outputs and answers after it - as few as make it fit,
    the instructions kept: the answer is the one to the conversation without them (truncation
    "disabled"), and without one turn fewer dropped it would not fit. "disabled" refuses it."""
    turns = long_conversation()
    body = greedy(instructions="Be brief.", tools=RESP_TOOLS, max_output_tokens=8)
    with Server("--ctx", str(TRUNC_CTX)) as srv:
        def ask(k, truncation):
            inp = [it for t in turns[k:] for it in t]
            return srv.post("/v1/responses", dict(body, input=inp, truncation=truncation))

        st, _, e = ask(0, "disabled")
        assert st == 400 and e["error"]["code"] == "context_length_exceeded", e
        st, _, r = ask(0, "auto")
        assert st == 200, r
        assert r["truncation"] == "auto" and r["status"] == "incomplete"
        assert r["usage"]["input_tokens"] + 8 <= TRUNC_CTX
        fits = [ask(k, "disabled")[0] == 200 for k in range(len(turns))]
        k = fits.index(True)
        assert 2 <= k < len(turns) - 1, fits  # some turns, not all, had to go
        st, _, want = ask(k, "disabled")
        assert text_of(r) == text_of(want) and text_of(r)
        assert r["usage"]["input_tokens"] == want["usage"]["input_tokens"]
        # streamed: the same answer
        st, _, data = srv.request("POST", "/v1/responses",
                                  dict(body, input=[it for t in turns for it in t],
                                       truncation="auto", stream=True))
        assert st == 200
        done = [json.loads(b.split("\n", 1)[1][len("data: "):])
                for b in data.decode().split("\n\n") if b.startswith("event: response.incompl")]
        assert text_of(done[0]["response"]) == text_of(want)


def test_truncation_auto_cannot_cut_the_last_question():
    """The last user message (and what follows it) is never dropped: when it alone is too long
    the request is refused as an over-long one is, saying that truncation could not help."""
    with Server("--ctx", str(TRUNC_CTX)) as srv:
        inp = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
               {"role": "user", "content": "the sea and the sky " * 200}]
        st, _, e = srv.post("/v1/responses", greedy(input=inp, truncation="auto",
                                                     max_output_tokens=8))
        assert st == 400 and e["error"]["code"] == "context_length_exceeded", e
        assert "truncation" in e["error"]["message"]
        # one that fits is answered as it is, nothing dropped
        r = responses(srv, greedy(input=inp[:2] + [user("ok")[0]], truncation="auto",
                                  max_output_tokens=4))
        r2 = responses(srv, greedy(input=inp[:2] + [user("ok")[0]], max_output_tokens=4))
        assert r["usage"]["input_tokens"] == r2["usage"]["input_tokens"]
        assert text_of(r) == text_of(r2)


# ---- stored responses: previous_response_id, GET and DELETE /v1/responses/{id} -----------------

def test_previous_response_id_is_the_conversation_sent_whole(srv):
    """A stored response named as previous_response_id is its conversation and its answer
    sent again: the same prompt (input tokens) and answer as the whole conversation as input.
    The previous instructions are not carried over (OpenAI's rule): the follow-up gives its own."""
    first = responses(srv, greedy(input="Tell me about cats.", instructions="Be brief.",
                                  max_output_tokens=10))
    assert first["store"] is True
    follow = responses(srv, greedy(input="And dogs?", previous_response_id=first["id"],
                                   instructions="Be brief.", max_output_tokens=10))
    assert follow["previous_response_id"] == first["id"]
    whole = responses(srv, greedy(instructions="Be brief.", max_output_tokens=10, input=[
        {"role": "user", "content": "Tell me about cats."},
        {"role": "assistant", "content": [{"type": "output_text", "text": text_of(first)}]},
        {"role": "user", "content": "And dogs?"}]))
    assert text_of(follow) == text_of(whole)
    assert follow["usage"]["input_tokens"] == whole["usage"]["input_tokens"]
    bare = responses(srv, greedy(input="And dogs?", previous_response_id=first["id"],
                                 max_output_tokens=10))
    assert bare["usage"]["input_tokens"] < follow["usage"]["input_tokens"]  # no instructions
    # a chain: the follow-up is stored too, with everything before it
    third = responses(srv, greedy(input="Thanks.", previous_response_id=follow["id"],
                                  instructions="Be brief.", max_output_tokens=4))
    assert third["usage"]["input_tokens"] > follow["usage"]["input_tokens"]


def test_tool_results_after_a_stored_response(srv):
    """The tool results for a stored response's calls go in alone: its calls, with the
    call_ids it gave them, are part of its conversation."""
    q = user("What is the weather in three days, and the time?")
    first = responses(srv, dict(input=q, tools=RESP_TOOLS, tool_choice="required",
                                temperature=0, max_output_tokens=300))
    calls = items(first, "function_call")
    assert calls
    outs = [{"type": "function_call_output", "call_id": fc["call_id"], "output": "sunny"}
            for fc in calls]
    chained = responses(srv, greedy(input=outs, previous_response_id=first["id"],
                                    tools=RESP_TOOLS, max_output_tokens=12))
    whole = responses(srv, greedy(input=q + calls + outs, tools=RESP_TOOLS, max_output_tokens=12))
    assert text_of(chained) == text_of(whole)
    assert chained["usage"]["input_tokens"] == whole["usage"]["input_tokens"]


def test_store_false_keeps_nothing(srv):
    r = responses(srv, greedy(input="x", max_output_tokens=2, store=False))
    assert r["store"] is False
    status, _, e = srv.request("GET", "/v1/responses/" + r["id"])
    assert status == 404 and json.loads(e)["error"]["code"] == "not_found"
    status, _, e = srv.post("/v1/responses", {"input": "y", "previous_response_id": r["id"]})
    assert status == 400 and e["error"]["code"] == "previous_response_not_found", e
    assert e["error"]["param"] == "previous_response_id"


def test_get_returns_the_answer_as_given(srv):
    """GET /v1/responses/{id}: the stored response object, the very one the answer was - whether
    it was answered whole or streamed."""
    r = responses(srv, greedy(input="Hello", max_output_tokens=5))
    status, _, body = srv.request("GET", "/v1/responses/" + r["id"])
    assert status == 200 and json.loads(body) == r
    events = sse(srv, greedy(input="Hello", max_output_tokens=5))
    final = events[-1][1]["response"]
    status, _, body = srv.request("GET", "/v1/responses/" + final["id"])
    assert status == 200 and json.loads(body) == final
    status, _, _ = srv.request("GET", "/v1/responses/resp_" + "0" * 400)  # longer than any id
    assert status == 404


def test_delete_forgets_a_stored_response(srv):
    """DELETE /v1/responses/{id}: OpenAI's deletion object; then it is gone for GET, DELETE and
    previous_response_id alike, and the store's other responses stay. Another method on the
    route -> 405 naming both it takes."""
    a = responses(srv, greedy(input="Hello", max_output_tokens=3))
    b = responses(srv, greedy(input="Hi", max_output_tokens=3))
    status, _, body = srv.request("DELETE", "/v1/responses/" + a["id"])
    assert status == 200 and json.loads(body) == {"id": a["id"], "object": "response",
                                                   "deleted": True}
    status, _, e = srv.request("GET", "/v1/responses/" + a["id"])
    assert status == 404 and json.loads(e)["error"]["code"] == "not_found"
    status, _, e = srv.request("DELETE", "/v1/responses/" + a["id"])
    assert status == 404 and json.loads(e)["error"]["code"] == "not_found"
    status, _, e = srv.post("/v1/responses", {"input": "y", "previous_response_id": a["id"]})
    assert status == 400 and e["error"]["code"] == "previous_response_not_found", e
    status, _, body = srv.request("GET", "/v1/responses/" + b["id"])
    assert status == 200 and json.loads(body) == b
    follow = responses(srv, greedy(input="And?", previous_response_id=b["id"],
                                   max_output_tokens=2))
    assert follow["previous_response_id"] == b["id"]
    status, hd, _ = srv.request("PUT", "/v1/responses/" + b["id"], body={})
    assert status == 405 and hd["allow"] == "GET, DELETE"
    status, _, _ = srv.request("DELETE", "/v1/responses")
    assert status == 405
    # the OpenAI client's delete (it expects no body it must read)
    srv.client().responses.delete(b["id"])
    assert srv.request("GET", "/v1/responses/" + b["id"])[0] == 404


def test_input_items_list_the_requests_input(srv):
    """GET /v1/responses/{id}/input_items: the request's own input as items (a string is one
    user message; text content becomes its part), with the client's ids or ones given here,
    the last first unless order=asc, in pages (limit, after, before, has_more); a follow-up's
    are its own input only; refusals; the OpenAI client's paging."""
    def page(rid, q=""):
        status, _, body = srv.request("GET", f"/v1/responses/{rid}/input_items{q}")
        return status, json.loads(body)

    r = responses(srv, greedy(input="Hello", max_output_tokens=2))
    status, p = page(r["id"])
    assert status == 200 and p["object"] == "list" and p["has_more"] is False
    (item,) = p["data"]
    assert item["type"] == "message" and item["role"] == "user"
    assert item["content"] == [{"type": "input_text", "text": "Hello"}]
    assert p["first_id"] == p["last_id"] == item["id"]
    calls = [{"type": "function_call", "call_id": "c1", "name": "get_time", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "noon"}]
    given = [{"role": "user", "content": "What time is it?"}, *calls,
             {"role": "assistant", "content": "It is noon."},
             {"type": "message", "role": "user", "id": "mine",
              "content": [{"type": "input_text", "text": "Thanks"}]}]
    r = responses(srv, greedy(input=given, tools=RESP_TOOLS, max_output_tokens=2))
    status, p = page(r["id"], "?order=asc")
    assert status == 200 and len(p["data"]) == 5
    assert [d.get("type") for d in p["data"]] == ["message", "function_call",
                                                  "function_call_output", "message", "message"]
    assert p["data"][3]["content"] == [{"type": "output_text", "text": "It is noon."}]
    assert p["data"][4]["id"] == "mine" and p["data"][1]["call_id"] == "c1"
    ids = [d["id"] for d in p["data"]]
    assert len(set(ids)) == 5
    status, d = page(r["id"])
    assert [x["id"] for x in d["data"]] == ids[::-1]  # desc: the last first
    status, a = page(r["id"], "?order=asc&limit=2")
    assert [x["id"] for x in a["data"]] == ids[:2] and a["has_more"] is True
    status, b = page(r["id"], f"?order=asc&limit=2&after={a['last_id']}")
    assert [x["id"] for x in b["data"]] == ids[2:4] and b["has_more"] is True
    status, c = page(r["id"], f"?order=asc&after={ids[3]}&limit=2")
    assert [x["id"] for x in c["data"]] == ids[4:] and c["has_more"] is False
    status, c = page(r["id"], f"?order=asc&before={ids[2]}")
    assert [x["id"] for x in c["data"]] == ids[:2]
    # a follow-up lists its own input, not the conversation before it
    f = responses(srv, greedy(input="And tomorrow?", previous_response_id=r["id"],
                              tools=RESP_TOOLS, max_output_tokens=2))
    status, p = page(f["id"])
    assert [x["content"][0]["text"] for x in p["data"]] == ["And tomorrow?"]
    # refusals
    for q, param in (("?limit=0", "limit"), ("?limit=101", "limit"), ("?limit=x", "limit"),
                     ("?order=up", "order"), ("?after=nope", "after"), ("?before=nope", "before")):
        status, e = page(r["id"], q)
        assert status == 400 and e["error"]["param"] == param, (q, e)
    kept_not = responses(srv, greedy(input="x", max_output_tokens=1, store=False))
    assert page(kept_not["id"])[0] == 404
    assert srv.request("DELETE", "/v1/responses/" + f["id"])[0] == 200
    assert page(f["id"])[0] == 404
    assert page("resp_" + "0" * 400)[0] == 404
    # the OpenAI client walks the pages by itself
    got = [x.id for x in srv.client().responses.input_items.list(r["id"], limit=2, order="asc")]
    assert got == ids


def test_the_store_keeps_the_latest_within_its_bound():
    """--responses-store-mb bounds the store: the oldest responses go first; 0 keeps none."""
    with Server("--responses-store-mb", "1") as s:
        # the response object echoes metadata, so each one kept holds ~20 KB of it
        meta = {"note": "x" * 20000}
        ids = [responses(s, {"input": f"{k}", "max_output_tokens": 1, "metadata": meta})["id"]
               for k in range(64)]  # ~1.3 MB in all
        assert s.request("GET", "/v1/responses/" + ids[0])[0] == 404
        assert s.request("GET", "/v1/responses/" + ids[-1])[0] == 200
        status, _, e = s.post("/v1/responses", {"input": "x", "previous_response_id": ids[0]})
        assert status == 400 and e["error"]["code"] == "previous_response_not_found"
        assert responses(s, {"input": "x", "previous_response_id": ids[-1],
                             "max_output_tokens": 1})["status"] in ("completed", "incomplete")
    with Server("--responses-store-mb", "0") as s:
        r = responses(s, {"input": "x", "max_output_tokens": 1})
        assert s.request("GET", "/v1/responses/" + r["id"])[0] == 404
