"""Anthropic's Messages API, POST /v1/messages and /v1/messages/count_tokens (docs/API.md, "The
Messages API").

The route is a translation: a Messages request is read as the chat request it means, runs as
one, and the answer is rendered as a message. So the checks send a Messages request and the
equivalent /v1/chat/completions request to the same server (greedy) and compare the text,
thinking, tool calls and token counts; then the stream's events against the whole message,
the errors' envelope, and Anthropic's own SDK where it is installed. The tiny random model
writes gibberish, deterministically; ids past the tokenizer's 1033 are banned (`logit_bias`,
forwarded as a chat extension) where texts are compared."""
import json

import pytest

from server_util import Server

TEXT_ONLY = {str(i): -100 for i in range(1033, 4096)}
MODEL = "serve-tiny"
WEATHER = {"type": "object",
           "properties": {"days": {"type": "integer"},
                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["days", "unit"]}
TOOLS = [{"name": "get_weather", "description": "The weather.", "input_schema": WEATHER}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather",
                                                "description": "The weather.",
                                                "parameters": WEATHER}}]


@pytest.fixture(scope="module")
def srv():
    with Server("--api-key", "sekret") as s:
        yield s


KEY = {"x-api-key": "sekret"}


def messages(srv, body, path="/v1/messages"):
    return srv.post(path, body, headers=KEY)


def chat(srv, body):
    st, _, r = srv.post("/v1/chat/completions", body,
                        headers={"Authorization": "Bearer sekret"})
    assert st == 200, r
    return r


def greedy(**kw):
    return dict({"model": MODEL, "temperature": 0, "logit_bias": TEXT_ONLY}, **kw)


def blocks(m, kind):
    return [b for b in m["content"] if b["type"] == kind]


def test_text_answer_is_chats():
    """A system prompt and a conversation (string and block contents) answer as the same chat:
    one text block, end_turn or max_tokens, the usage's tokens."""
    with Server("--api-key", "sekret", "--cache-mb", "0") as srv:
        body = greedy(max_tokens=12, system=[{"type": "text", "text": "Be brief."}], messages=[
            {"role": "user", "content": "Hello there."},
            {"role": "assistant", "content": [{"type": "text", "text": "Hi."}]},
            {"role": "user", "content": [{"type": "text", "text": "Tell me about the sea."}]}])
        st, hd, m = messages(srv, body)
        assert st == 200, m
        want = chat(srv, greedy(max_tokens=12, messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello there."}, {"role": "assistant", "content": "Hi."},
            {"role": "user", "content": "Tell me about the sea."}],
            chat_template_kwargs={"enable_thinking": False}))
        assert m["type"] == "message" and m["role"] == "assistant" and m["model"] == MODEL
        assert m["id"].startswith("msg_")
        assert [b["type"] for b in m["content"]] == ["text"]
        assert "choices" in want, want
        assert m["content"][0]["text"] == want["choices"][0]["message"]["content"]
        reason = {"length": "max_tokens", "stop": "end_turn"}[want["choices"][0]["finish_reason"]]
        assert m["stop_reason"] == reason and m["stop_sequence"] is None
        u = m["usage"]
        assert u["input_tokens"] + u["cache_read_input_tokens"] == want["usage"]["prompt_tokens"]
        assert u["output_tokens"] == want["usage"]["completion_tokens"]
        # count_tokens: the same prompt's tokens
        body.pop("max_tokens")
        st, _, c = messages(srv, body, "/v1/messages/count_tokens")
        assert st == 200 and c == {"input_tokens": want["usage"]["prompt_tokens"]}, c


def test_stop_sequence(srv):
    m = messages(srv, greedy(max_tokens=40, messages=[{"role": "user", "content": "Count."}]))[2]
    text = m["content"][0]["text"]
    cut = next(i for i in range(2, len(text) - 2) if text[i:i + 2].strip()
               and "\ufffd" not in text[i:i + 2])
    st, _, s = messages(srv, greedy(max_tokens=40, stop_sequences=[text[cut:cut + 2]],
                                    messages=[{"role": "user", "content": "Count."}]))
    assert st == 200, s
    assert s["stop_reason"] == "stop_sequence" and s["stop_sequence"] == text[cut:cut + 2]
    assert s["content"][0]["text"] == text[:cut]


def test_text_documents(srv):
    """A plain-text document block (source text, or content blocks) is read as a text part: its
    title and context each on a line before its text, in the message's order; a PDF and
    citations are refused, not left out."""
    doc = {"type": "document", "title": "Notes", "context": "From the wiki.",
           "source": {"type": "text", "media_type": "text/plain", "data": "The sky is blue."}}
    body = greedy(max_tokens=8, messages=[{"role": "user", "content": [
        doc, {"type": "text", "text": "What colour is the sky?"}]}])
    st, _, m = messages(srv, body)
    assert st == 200, m
    want = chat(srv, greedy(max_tokens=8, messages=[{"role": "user", "content": [
        {"type": "text", "text": "Notes\n\nFrom the wiki.\n\nThe sky is blue."},
        {"type": "text", "text": "What colour is the sky?"}]}]))
    assert m["usage"]["input_tokens"] == want["usage"]["prompt_tokens"]
    assert m["content"][0]["text"] == want["choices"][0]["message"]["content"]
    blocks = dict(doc, title=None, context=None,
                  source={"type": "content", "content": [{"type": "text", "text": "The sky "},
                                                         {"type": "text", "text": "is blue."}]})
    st, _, m2 = messages(srv, dict(body, messages=[{"role": "user", "content": [
        blocks, {"type": "text", "text": "What colour is the sky?"}]}]))
    want2 = chat(srv, greedy(max_tokens=8, messages=[{"role": "user", "content": [
        {"type": "text", "text": "The sky is blue."},
        {"type": "text", "text": "What colour is the sky?"}]}]))
    assert st == 200 and m2["usage"]["input_tokens"] == want2["usage"]["prompt_tokens"], m2
    for bad, says in ((dict(doc, source={"type": "base64", "media_type": "application/pdf",
                                         "data": "JVBERi0="}), "plain-text documents"),
                      (dict(doc, citations={"enabled": True}), "citations")):
        st, _, e = messages(srv, dict(body, messages=[{"role": "user", "content": [bad]}]))
        assert st == 400 and says in e["error"]["message"], e


def test_thinking_block(srv):
    """thinking enabled: the model's thinking is a thinking block before the text; left out,
    thinking is off (Anthropic's default) and there is none."""
    body = greedy(max_tokens=30, thinking={"type": "enabled", "budget_tokens": 1024},
                  messages=[{"role": "user", "content": "Think."}])
    m = messages(srv, body)[2]
    want = chat(srv, greedy(max_tokens=30, messages=[{"role": "user", "content": "Think."}],
                            chat_template_kwargs={"enable_thinking": True}))
    assert blocks(m, "thinking")[0]["thinking"] == \
        want["choices"][0]["message"]["reasoning_content"]
    off = messages(srv, dict(body, thinking=None))[2]
    assert not blocks(off, "thinking")
    adaptive = messages(srv, dict(body, thinking={"type": "adaptive"}))[2]
    assert adaptive["content"] == m["content"]
    st, _, e = messages(srv, dict(body, thinking={"type": "sometimes"}))
    assert st == 400 and "thinking" in e["error"]["message"]


def test_tool_use_round_trip(srv):
    """A forced tool: a tool_use block whose input is the call's arguments as an object,
    stop_reason tool_use; the conversation sent back with the tool_use and a tool_result is
    the chat with the call and the tool's message."""
    body = greedy(max_tokens=200, tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"},
                  messages=[{"role": "user", "content": "Weather?"}])
    st, _, m = messages(srv, body)
    assert st == 200, m
    (use,) = blocks(m, "tool_use")
    assert use["name"] == "get_weather" and isinstance(use["input"], dict)
    assert use["input"]["unit"] in ("celsius", "fahrenheit") and use["id"].startswith("toolu_")
    assert m["stop_reason"] == "tool_use"
    want = chat(srv, greedy(max_tokens=200, tools=CHAT_TOOLS, messages=[
        {"role": "user", "content": "Weather?"}], chat_template_kwargs={"enable_thinking": False},
        tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    call = want["choices"][0]["message"]["tool_calls"][0]["function"]
    assert json.loads(call["arguments"]) == use["input"]
    follow = [{"role": "user", "content": "Weather?"},
              {"role": "assistant", "content": [use]},
              {"role": "user", "content": [
                  {"type": "tool_result", "tool_use_id": use["id"], "content": "sunny"},
                  {"type": "text", "text": "And tomorrow?"}]}]
    st, _, m2 = messages(srv, greedy(max_tokens=10, tools=TOOLS, messages=follow))
    assert st == 200, m2
    want2 = chat(srv, greedy(max_tokens=10, tools=CHAT_TOOLS, messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": use["id"], "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps(use["input"])}}]},
        {"role": "tool", "tool_call_id": use["id"], "content": "sunny"},
        {"role": "user", "content": "And tomorrow?"}],
        chat_template_kwargs={"enable_thinking": False}))
    assert m2["usage"]["input_tokens"] + m2["usage"]["cache_read_input_tokens"] == \
        want2["usage"]["prompt_tokens"]
    assert "".join(b.get("text", "") for b in m2["content"]) == \
        (want2["choices"][0]["message"]["content"] or "")


def sse(srv, body):
    st, hd, data = srv.request("POST", "/v1/messages", dict(body, stream=True), headers=KEY)
    assert st == 200, data
    assert hd["content-type"].startswith("text/event-stream")
    out = []
    for block in data.decode().split("\n\n"):
        if not block.strip():
            continue
        head, payload = block.split("\n", 1)
        ev = json.loads(payload[len("data: "):])
        assert head == "event: " + ev["type"]
        out.append(ev)
    return out


@pytest.mark.parametrize("case", ["text", "thinking", "tool"])
def test_stream_is_the_message(srv, case):
    """The stream is the message told as events: message_start, each block's start / deltas /
    stop (indices in order), message_delta with the stop_reason and usage, message_stop; the
    deltas add up to the blocks."""
    body = {"text": greedy(max_tokens=20, messages=[{"role": "user", "content": "Hi"}]),
            "thinking": greedy(max_tokens=30, thinking={"type": "enabled", "budget_tokens": 999},
                               messages=[{"role": "user", "content": "Hi"}]),
            "tool": greedy(max_tokens=200, tools=TOOLS, tool_choice={"type": "any"},
                           messages=[{"role": "user", "content": "Weather?"}])}[case]
    want = messages(srv, body)[2]
    evs = sse(srv, body)
    assert evs[0]["type"] == "message_start" and evs[0]["message"]["content"] == []
    assert evs[-1]["type"] == "message_stop"
    assert evs[-2]["type"] == "message_delta"
    assert evs[-2]["delta"]["stop_reason"] == want["stop_reason"]
    assert evs[-2]["usage"]["output_tokens"] == want["usage"]["output_tokens"]
    got, open_block = [], None
    for ev in evs[1:-2]:
        if ev["type"] == "content_block_start":
            assert open_block is None and ev["index"] == len(got)
            open_block = dict(ev["content_block"])
            if open_block["type"] == "tool_use":
                open_block["partial"] = ""
        elif ev["type"] == "content_block_delta":
            d = ev["delta"]
            assert ev["index"] == len(got)
            if d["type"] == "text_delta":
                open_block["text"] += d["text"]
            elif d["type"] == "thinking_delta":
                open_block["thinking"] += d["thinking"]
            elif d["type"] == "input_json_delta":
                open_block["partial"] += d["partial_json"]
            else:
                assert d["type"] == "signature_delta"
        else:
            assert ev["type"] == "content_block_stop" and ev["index"] == len(got)
            if open_block["type"] == "tool_use":
                open_block["input"] = json.loads(open_block.pop("partial"))
            got.append(open_block)
            open_block = None
    no_id = [{k: v for k, v in b.items() if k != "id"} for b in got]
    assert no_id == [{k: v for k, v in b.items() if k != "id"} for b in want["content"]]
    assert all(b["id"].startswith(evs[0]["message"]["id"].replace("msg_", "toolu_"))
               for b in got if b["type"] == "tool_use")
    kinds = [b["type"] for b in got]
    assert {"text": "text", "thinking": "thinking", "tool": "tool_use"}[case] in kinds


@pytest.mark.parametrize("body,says", [
    ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"max_tokens": 5, "messages": []}, "messages"),
    ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "role"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {}}]}]}, "document"),
    ({"max_tokens": 5, "tools": [{"type": "web_search_20250305", "name": "web_search"}],
      "messages": [{"role": "user", "content": "x"}]}, "custom tools"),
    ({"max_tokens": 5, "tool_choice": {"type": "sometimes"},
      "messages": [{"role": "user", "content": "x"}]}, "tool_choice"),
    ({"max_tokens": 5, "temperature": 7, "messages": [{"role": "user", "content": "x"}]},
     "temperature"),
    ({"max_tokens": 5, "stop_sequences": "x", "messages": [{"role": "user", "content": "x"}]},
     "stop_sequences"),
    ({"max_tokens": 5, "model": "claude-nope", "messages": [{"role": "user", "content": "x"}]},
     "claude-nope"),
])
def test_errors_in_anthropics_envelope(srv, body, says):
    st, _, e = messages(srv, body)
    assert 400 <= st < 500, e
    assert e["type"] == "error" and says in e["error"]["message"], e
    assert e["error"]["type"] == ("not_found_error" if st == 404 else "invalid_request_error")


def test_the_key_and_malformed_bodies_in_anthropics_envelope(srv):
    st, _, e = srv.post("/v1/messages", {"max_tokens": 5, "messages": []})
    assert st == 401 and e["error"]["type"] == "authentication_error", e
    st, _, e = srv.post("/v1/messages", {"max_tokens": 5, "messages": []},
                        headers={"x-api-key": "wrong"})
    assert st == 401 and e["type"] == "error", e
    st, _, data = srv.request("POST", "/v1/messages", '{"max_tokens": ', headers=KEY)
    assert st == 400 and json.loads(data)["type"] == "error", data


def test_anthropic_sdk(srv):
    anthropic = pytest.importorskip("anthropic")
    c = anthropic.Anthropic(base_url=srv.base, api_key="sekret", max_retries=0)
    greedy_body = {"temperature": 0}  # not a parameter of every SDK version's create()
    m = c.messages.create(model=MODEL, max_tokens=8, extra_body=greedy_body,
                          messages=[{"role": "user", "content": "Hello"}])
    assert m.type == "message" and m.content and m.content[0].type == "text"
    with c.messages.stream(model=MODEL, max_tokens=8, extra_body=greedy_body,
                           messages=[{"role": "user", "content": "Hello"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == m.content[0].text == final.content[0].text
    assert c.messages.count_tokens(model=MODEL, messages=[
        {"role": "user", "content": "Hello"}]).input_tokens > 0
