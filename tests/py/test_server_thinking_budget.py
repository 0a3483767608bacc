"""The thinking budget: a request's thinking_token_budget (vLLM's), the server's
--reasoning-budget and --reasoning-budget-message, Responses' pass-through and Messages'
thinking.budget_tokens. Once the answer has thought its budget of tokens, the server puts in
</think> (after the message) instead of the model's draws, and the answer goes on as content.

The tiny random model thinks without end, so the answer without a budget is the reference:
with one, its first tokens are the same, then the end is put in."""
import json
import os
import subprocess

import pytest

from server_util import Server, binary, fixtures, tiny_model

MSG = [{"role": "user", "content": "Tell me a story."}]
THINK = {"enable_thinking": True}


@pytest.fixture(scope="module")
def srv():
    with Server("--alias", "tiny-test") as s:
        yield s


def chat(srv, **kw):
    body = {"model": "tiny-test", "messages": MSG, "max_tokens": 40, "temperature": 0,
            "return_token_ids": True, "chat_template_kwargs": THINK}
    body.update(kw)
    st, _, r = srv.post("/v1/chat/completions", body)
    assert st == 200, r
    return r["choices"][0]


def token_id(srv, text):
    st, _, t = srv.post("/tokenize", {"content": text})
    assert st == 200 and t["count"] == 1, t
    return t["tokens"][0]


def vocab_size():
    """The tokenizer's: the random model draws ids past it too, which have no text."""
    with open(os.path.join(fixtures(), "tokenizer", "small", "tokenizer.json")) as f:
        t = json.load(f)
    return 1 + max(list(t["model"]["vocab"].values()) + [a["id"] for a in t["added_tokens"]])


def detok(srv, ids):
    v = vocab_size()
    st, _, d = srv.post("/detokenize", {"tokens": [i for i in ids if i < v]})
    assert st == 200, d
    return d["content"]


def budget_point(srv, ids, n):
    """Where the end goes for a budget of n: at n, or up to 3 tokens later while the thinking
    ends inside a character (its bytes held back)."""
    c = n
    while c < n + 3 and detok(srv, ids[:c]).endswith("\ufffd") and \
            not detok(srv, ids[:c + 1]).startswith(detok(srv, ids[:c])):
        c += 1
    return c


def test_budget_ends_the_thinking(srv):
    close = token_id(srv, "</think>")
    free = chat(srv)
    ids = free["token_ids"]
    assert close not in ids and free["message"]["content"] == ""  # thinks to the end
    opener, reopened = token_id(srv, "<think>"), []
    for n in (1, 8, 20):
        got = chat(srv, thinking_token_budget=n)
        c = budget_point(srv, ids, n)
        out = got["token_ids"]
        assert out[:c] == ids[:c] and out[c] == close, (n, c, out)
        assert len(out) == 40 and got["finish_reason"] == "length"
        # the reasoning is the thought tokens' text, the rest is content
        assert got["message"]["reasoning_content"] == detok(srv, ids[:c]).strip("\n")
        assert got["message"]["content"]
        # thinking opened again in the content (the model did, for one of these): its budget
        # is spent, so the end (here just </think>) is put in right after <think>
        for at in (i for i in range(c + 1, len(out) - 1) if out[i] == opener):
            reopened.append(n)
            assert out[at + 1] == close, out
    assert reopened, "no answer opened its thinking again: the check above tested nothing"


def test_budget_zero_and_unbounded(srv):
    close = token_id(srv, "</think>")
    free = chat(srv)
    zero = chat(srv, thinking_token_budget=0)
    assert zero["token_ids"][0] == close
    assert not zero["message"].get("reasoning_content") and zero["message"]["content"]
    assert chat(srv, thinking_token_budget=-1)["token_ids"] == free["token_ids"]
    assert chat(srv, thinking_token_budget=40)["token_ids"] == free["token_ids"]
    # thinking off: nothing to bound, the answer as without a budget
    off = dict(chat_template_kwargs={"enable_thinking": False})
    assert chat(srv, thinking_token_budget=0, **off)["token_ids"] == chat(srv, **off)["token_ids"]


def test_budget_waits_for_a_character(srv):
    """A thought that ends inside a character: the end waits for the character's bytes (3 at
    most). logit_bias makes every draw the byte token 0xE4, which begins a 3-byte character."""
    close = token_id(srv, "</think>")
    bias = {"160": 100}
    got = chat(srv, thinking_token_budget=2, logit_bias=bias, max_tokens=8)["token_ids"]
    assert got[:5] == [160] * 5 and got[5] == close, got


def test_stream_and_logprobs(srv):
    """Streamed, the reasoning and content add up to the answer; the tokens put in carry the
    model's own log-probabilities for them."""
    want = chat(srv, thinking_token_budget=8, logprobs=True, top_logprobs=2)
    lp = want["logprobs"]["content"]
    assert len(lp) == 40 and all(x["logprob"] <= 0 for x in lp)
    c = want["token_ids"].index(token_id(srv, "</think>"))
    assert lp[c]["token"] == "</think>" and lp[c]["logprob"] < lp[c]["top_logprobs"][1]["logprob"]
    st, _, data = srv.request("POST", "/v1/chat/completions", {
        "model": "tiny-test", "messages": MSG, "max_tokens": 40, "temperature": 0,
        "stream": True, "chat_template_kwargs": THINK, "thinking_token_budget": 8})
    assert st == 200
    reasoning = content = ""
    for line in data.decode().splitlines():
        if line.startswith("data: {"):
            ch = json.loads(line[6:])["choices"]
            if ch:
                reasoning += ch[0]["delta"].get("reasoning_content") or ""
                content += ch[0]["delta"].get("content") or ""
    assert reasoning == want["message"]["reasoning_content"]
    assert content == want["message"]["content"]


def test_guesses_do_not_pass_the_end(srv):
    """Speculative decoding: with the unbounded answer as the prediction, every guess is
    right up to the budget; the end put in must still replace the guessed token."""
    free = chat(srv)
    want = chat(srv, thinking_token_budget=8)
    text = free["message"]["reasoning_content"]
    got = chat(srv, thinking_token_budget=8, prediction={"type": "content", "content": text})
    assert got["token_ids"] == want["token_ids"]


def test_server_default_and_message(srv):
    close = token_id(srv, "</think>")
    free = chat(srv)["token_ids"]
    note = " Time is up."
    with Server("--alias", "tiny-test", "--reasoning-budget", "4",
                "--reasoning-budget-message", note) as s:
        st, _, t = s.post("/tokenize", {"content": note, "parse_special": False})
        end = t["tokens"] + [close]
        got = chat(s)
        c = budget_point(s, free, 4)
        assert got["token_ids"][:c + len(end)] == free[:c] + end
        assert got["message"]["reasoning_content"].endswith("Time is up.")
        # the request's own budget wins, -1 none
        assert chat(s, thinking_token_budget=-1)["token_ids"] == free
        assert chat(s, thinking_token_budget=0)["token_ids"][:len(end)] == end
        st, _, p = s.request("GET", "/props")
        assert json.loads(p)["default_generation_settings"]["params"]["thinking_token_budget"] == 4
    st, _, p = srv.request("GET", "/props")
    assert json.loads(p)["default_generation_settings"]["params"]["thinking_token_budget"] == -1


@pytest.mark.parametrize("bad", ["8", 1.5, -2, True, 2**31])
def test_bad_budget(srv, bad):
    body = {"model": "tiny-test", "messages": MSG, "max_tokens": 4, "thinking_token_budget": bad}
    st, _, e = srv.post("/v1/chat/completions", body)
    assert st == 400 and e["error"]["param"] == "thinking_token_budget", e
    st, _, e = srv.post("/v1/completions", dict(body, messages=None, prompt="Hi"))
    assert st == 400 and e["error"]["param"] == "thinking_token_budget", e
    st, _, e = srv.post("/v1/messages", {
        "model": "tiny-test", "max_tokens": 4, "messages": MSG,
        "thinking": {"type": "enabled", "budget_tokens": bad}})
    assert st == 400 and e["error"]["type"] == "invalid_request_error", e
    assert "budget_tokens" in e["error"]["message"]


def test_responses_and_messages(srv):
    want = chat(srv, thinking_token_budget=8)
    st, _, r = srv.post("/v1/responses", {
        "model": "tiny-test", "input": MSG[0]["content"], "max_output_tokens": 40,
        "temperature": 0, "chat_template_kwargs": THINK, "thinking_token_budget": 8})
    assert st == 200, r
    items = {i["type"]: i for i in r["output"]}
    assert items["reasoning"]["content"][0]["text"] == want["message"]["reasoning_content"]
    assert items["message"]["content"][0]["text"] == want["message"]["content"]
    st, _, m = srv.post("/v1/messages", {
        "model": "tiny-test", "max_tokens": 40, "temperature": 0, "messages": MSG,
        "thinking": {"type": "enabled", "budget_tokens": 8}})
    assert st == 200, m
    blocks = {b["type"]: b for b in m["content"]}
    assert blocks["thinking"]["thinking"] == want["message"]["reasoning_content"]
    assert blocks["text"]["text"] == want["message"]["content"]


def test_budget_then_grammar(srv):
    """A response format constrains the content only: the thinking is free up to its budget,
    the end is put in, and the content then follows the schema."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    got = chat(srv, thinking_token_budget=6, max_tokens=200,
               response_format={"type": "json_schema",
                                "json_schema": {"name": "x", "schema": schema}})
    assert got["token_ids"][6] == token_id(srv, "</think>")
    assert got["finish_reason"] == "stop"
    assert set(json.loads(got["message"]["content"])) == {"a"}


def test_choices_decode_together(srv):
    """n choices decode in one batch, each lane with its own budget's end put in at its own
    step: each equals the request for that choice alone (choice c's seed is seed + c)."""
    body = dict(thinking_token_budget=6, temperature=0.9, seed=40, max_tokens=24)
    st, _, r = srv.post("/v1/chat/completions", {
        "model": "tiny-test", "messages": MSG, "return_token_ids": True, "n": 3,
        "chat_template_kwargs": THINK, **body})
    assert st == 200, r
    close = token_id(srv, "</think>")
    for c in r["choices"]:
        alone = chat(srv, **dict(body, seed=40 + c["index"]))
        assert c["token_ids"] == alone["token_ids"], c["index"]
        assert close in c["token_ids"][6:10], c["token_ids"]


def test_reasoning_effort_budgets(srv):
    """--reasoning-effort-budgets: the budget a reasoning_effort gives (chat's field, and the
    Responses API's reasoning.effort), between the request's own thinking_token_budget, which
    wins, and --reasoning-budget, which an effort without a budget of its own keeps."""
    close = token_id(srv, "</think>")
    free = chat(srv)["token_ids"]
    with Server("--alias", "tiny-test", "--reasoning-budget", "10",
                "--reasoning-effort-budgets", "low=4,high=-1") as s:
        def closed_at(**kw):
            ids = chat(s, **kw)["token_ids"]
            return ids.index(close) if close in ids else None

        assert closed_at(reasoning_effort="low") == budget_point(s, free, 4)
        assert closed_at(reasoning_effort="medium") == budget_point(s, free, 10)  # the default
        assert closed_at(reasoning_effort="high") is None
        assert closed_at(reasoning_effort="low", thinking_token_budget=6) == budget_point(s, free, 6)
        assert closed_at() == budget_point(s, free, 10)
        st, _, r = s.post("/v1/responses", {
            "model": "tiny-test", "input": MSG[0]["content"], "max_output_tokens": 40,
            "temperature": 0, "chat_template_kwargs": THINK, "reasoning": {"effort": "low"}})
        assert st == 200, r
        want = chat(s, reasoning_effort="low")
        items = {i["type"]: i for i in r["output"]}
        assert items["reasoning"]["content"][0]["text"] == want["message"]["reasoning_content"]
        st, _, p = s.request("GET", "/props")
        params = json.loads(p)["default_generation_settings"]["params"]
        assert params["reasoning_effort_budgets"] == {"low": 4, "high": -1}
    for bad in ("low", "low=x", "huge=5", "none=3", "low=-2"):
        p = subprocess.run([binary(), "serve", "-m", tiny_model(), "--port", "0",
                            "--reasoning-effort-budgets", bad], capture_output=True, timeout=30)
        assert p.returncode == 1 and b"reasoning-effort-budgets" in p.stderr, (bad, p.stderr)


def test_reasoning_format_none_leaves_the_thinking_in_the_content(srv):
    """llama-server's reasoning_format: "none" leaves the thinking in the content as written
    (its </think> too), "deepseek" / "auto" (the default) put it apart as reasoning_content;
    the tokens are the same either way. The server's --reasoning-format none makes it the
    default of OpenAI's chat, while the Responses and Messages APIs keep their blocks."""
    split = chat(srv, thinking_token_budget=5)
    inline = chat(srv, thinking_token_budget=5, reasoning_format="none")
    assert inline["token_ids"] == split["token_ids"]
    assert "reasoning_content" not in inline["message"], inline
    assert split["message"]["reasoning_content"] and "</think>" not in split["message"]["content"]
    assert inline["message"]["content"] == detok(srv, inline["token_ids"])
    assert "</think>" in inline["message"]["content"]
    assert chat(srv, thinking_token_budget=5, reasoning_format="auto")["message"] == \
        split["message"]
    st, _, e = srv.post("/v1/chat/completions", {"messages": MSG, "reasoning_format": "raw"})
    assert st == 400 and e["error"]["param"] == "reasoning_format", e
    with Server("--reasoning-format", "none", "--alias", "tiny-test") as s:
        assert chat(s, thinking_token_budget=5)["message"] == inline["message"]
        assert chat(s, thinking_token_budget=5, reasoning_format="deepseek")["message"] == \
            split["message"]
        st, _, p = s.request("GET", "/props")
        assert json.loads(p)["default_generation_settings"]["params"]["reasoning_format"] == \
            "none"
        st, _, m = s.post("/v1/messages", {"max_tokens": 40, "messages": MSG, "temperature": 0,
                                           "thinking": {"type": "enabled", "budget_tokens": 5}})
        assert st == 200 and m["content"][0]["type"] == "thinking", m
    r = subprocess.run([binary(), "serve", "-m", tiny_model(), "--reasoning-format", "raw"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "--reasoning-format" in r.stderr, r.stderr  # a usage error


def test_the_thinking_in_both_fields_clients_read(srv):
    """The thinking goes in reasoning_content (llama-server's, DeepSeek's) and reasoning
    (vLLM's, OpenRouter's), whole and streamed; --reasoning-field picks one. An earlier
    answer's thinking sent back in either field renders the same; both differing is a 400."""
    m = chat(srv, thinking_token_budget=5)["message"]
    assert m["reasoning"] == m["reasoning_content"] and m["reasoning"]
    body = {"model": "tiny-test", "messages": MSG, "max_tokens": 12, "temperature": 0,
            "chat_template_kwargs": THINK, "thinking_token_budget": 5, "stream": True}
    st, _, data = srv.request("POST", "/v1/chat/completions", body)
    deltas = [json.loads(ln[6:])["choices"][0]["delta"] for ln in data.decode().splitlines()
              if ln.startswith("data: {") and '"choices":[{' in ln]
    thought = [d for d in deltas if "reasoning_content" in d or "reasoning" in d]
    assert thought and all(d["reasoning"] == d["reasoning_content"] for d in thought)
    assert "".join(d["reasoning"] for d in thought) == m["reasoning"]
    for flag, want, gone in (("reasoning", "reasoning", "reasoning_content"),
                             ("reasoning_content", "reasoning_content", "reasoning")):
        with Server("--reasoning-field", flag, "--alias", "tiny-test") as s:
            one = chat(s, thinking_token_budget=5)["message"]
            assert one[want] == m[want] and gone not in one, one
    # a tool call's turn after the last user message: its thinking is rendered
    call = {"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}
    turn = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "noon"}]
    ids = {}
    for k in ("reasoning_content", "reasoning", None):
        msgs = [dict(t) for t in turn]
        if k:
            msgs[1][k] = "I think so."
        st, _, t = srv.post("/tokenize", {"messages": msgs, "chat_template_kwargs": THINK})
        assert st == 200, t
        ids[k] = t["tokens"]
    assert ids["reasoning"] == ids["reasoning_content"] != ids[None]
    msgs = [dict(t) for t in turn]
    msgs[1].update(reasoning="a", reasoning_content="b")
    st, _, e = srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 2})
    assert st == 400 and e["error"]["param"] == "messages[1].reasoning_content", e
