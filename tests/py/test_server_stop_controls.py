"""vLLM's stop controls, on both routes: stop_token_ids end the answer (a stop token's text, when
it has any, kept); the answer's first min_tokens tokens cannot end it - end-of-generation tokens
and stop tokens are banned from those draws, stop strings not looked for;
include_stop_str_in_output shows the stop string that ended the answer."""
import json

from server_util import Server

PROMPT = "Once upon a time"


def complete(srv, **kw):
    body = {"prompt": PROMPT, "temperature": 0, "return_token_ids": True}
    body.update(kw)
    status, _, r = srv.post("/v1/completions", body)
    assert status == 200, r
    return r["choices"][0], r["usage"]


def test_a_stop_token_ends_the_answer_with_its_text():
    with Server() as srv:
        full, _ = complete(srv, max_tokens=20, ignore_eos=True)
        ids = full["token_ids"]
        k = next(i for i in range(3, 20) if ids[i] not in ids[:i])  # a first occurrence
        c, u = complete(srv, max_tokens=20, ignore_eos=True, stop_token_ids=[ids[k]])
        assert c["token_ids"] == ids[:k + 1] and c["finish_reason"] == "stop"
        assert c["stop_reason"] == ids[k]  # vLLM's: what stopped it
        assert full["stop_reason"] is None  # the length
        same, _ = complete(srv, max_tokens=k + 1, ignore_eos=True)
        assert c["text"] == same["text"]  # the stop token's text is kept
        assert u["completion_tokens"] == k + 1
        # chat too
        status, _, r = srv.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "temperature": 0,
            "max_tokens": 20, "ignore_eos": True, "return_token_ids": True})
        ids = r["choices"][0]["token_ids"]
        k = next(i for i in range(2, 20) if ids[i] not in ids[:i])
        status, _, r = srv.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "temperature": 0,
            "max_tokens": 20, "ignore_eos": True, "return_token_ids": True,
            "stop_token_ids": [ids[k]]})
        assert r["choices"][0]["token_ids"] == ids[:k + 1]
        assert r["choices"][0]["finish_reason"] == "stop"
        assert r["choices"][0]["stop_reason"] == ids[k]


def test_min_tokens_bans_the_end_of_generation():
    with Server() as srv:
        check_min_tokens_bans_the_end(srv)


def check_min_tokens_bans_the_end(srv):
    """(also run on the GPU: test_server_cuda.py)"""
    _, _, t = srv.post("/tokenize", {"content": "<|endoftext|>"})
    eos = t["tokens"][0]
    # a bias that makes the end of generation the only likely draw: the answer ends at once
    c, u = complete(srv, max_tokens=20, logit_bias={str(eos): 100})
    assert c["finish_reason"] == "stop" and u["completion_tokens"] <= 1
    assert c["stop_reason"] is None  # the end of generation is no stop of the request's
    # ... but not before min_tokens, and then at once; sampled or greedy
    for temp, lp in ((0, None), (1.0, None), (1.0, 1)):
        c, u = complete(srv, max_tokens=20, logit_bias={str(eos): 100}, min_tokens=6,
                        temperature=temp, seed=3, logprobs=lp)
        assert c["finish_reason"] == "stop", c
        assert u["completion_tokens"] == 7 and eos not in c["token_ids"][:6]
        assert lp is None or all(x > -1e30 for x in c["logprobs"]["token_logprobs"])
    # ignore_eos: not banned, not an end
    c, u = complete(srv, max_tokens=8, logit_bias={str(eos): 100}, min_tokens=6,
                    ignore_eos=True)
    assert c["finish_reason"] == "length" and c["token_ids"][0] == eos


def test_min_tokens_holds_stop_tokens_and_stop_strings_back():
    with Server() as srv:
        full, _ = complete(srv, max_tokens=30, ignore_eos=True)
        ids = full["token_ids"]
        first = ids[2]
        banned, _ = complete(srv, max_tokens=6, ignore_eos=True, logit_bias={str(first): -100})
        c, _ = complete(srv, max_tokens=30, ignore_eos=True, stop_token_ids=[first],
                        min_tokens=6)
        # the first 6 draws are those with the token banned; after them it may end the answer
        assert c["token_ids"][:6] == banned["token_ids"]
        assert first not in c["token_ids"][:-1]
        assert c["finish_reason"] == ("stop" if c["token_ids"][-1] == first else "length")
        # a stop string met early ends the answer early, unless it comes before min_tokens
        text = full["text"]
        stop = next(text[i:i + 2] for i in range(1, len(text) - 1)
                    if text[i:i + 2].strip() and len(text[i:i + 2].encode()) == 2)
        early, _ = complete(srv, max_tokens=30, ignore_eos=True, stop=["\u00ff", stop])
        assert early["text"] == text[:text.index(stop)]
        assert early["stop_reason"] == stop
        late, u = complete(srv, max_tokens=30, ignore_eos=True, stop=stop, min_tokens=12)
        assert u["completion_tokens"] >= 12
        assert late["text"].startswith(text[:text.index(stop) + len(stop)])
        assert text.startswith(late["text"])


def test_include_stop_str_in_output():
    with Server() as srv:
        for route in ("/v1/completions", "/v1/chat/completions"):
            body = {"temperature": 0, "max_tokens": 30, "ignore_eos": True}
            if route == "/v1/completions":
                body["prompt"] = PROMPT
            else:
                body["messages"] = [{"role": "user", "content": PROMPT}]
            status, _, data = srv.request("POST", route, body)
            text = answer_text(data, False)
            stop = next(text[i:i + 2] for i in range(1, len(text) - 1)
                        if text[i:i + 2].strip() and len(text[i:i + 2].encode()) == 2)
            cut = text.index(stop)
            answers = []
            for keep in (False, True):
                for stream in (False, True):
                    b = dict(body, stop=stop, include_stop_str_in_output=keep, stream=stream)
                    status, _, data = srv.request("POST", route, b)
                    assert status == 200, data
                    answers.append(answer_text(data, stream))
            # min_tokens 1: stop strings are looked for from the first token on, still shown
            status, _, data = srv.request("POST", route, dict(
                body, stop=stop, include_stop_str_in_output=True, min_tokens=1))
            answers.append(answer_text(data, False))
            assert answers == [text[:cut]] * 2 + [text[:cut] + stop] * 3, (route, stop)


def answer_text(data, stream):
    if not stream:
        c = json.loads(data)["choices"][0]
        return c["text"] if "text" in c else c["message"]["content"]
    out = ""
    for line in data.decode().splitlines():
        if line.startswith("data: {"):
            for c in json.loads(line[6:])["choices"]:
                out += c.get("text") or (c.get("delta") or {}).get("content") or ""
    return out


def test_stop_reason_in_the_stream():
    with Server() as srv:
        full, _ = complete(srv, max_tokens=20, ignore_eos=True)
        ids = full["token_ids"]
        k = next(i for i in range(3, 20) if ids[i] not in ids[:i])
        status, _, data = srv.request("POST", "/v1/completions", {
            "prompt": PROMPT, "temperature": 0, "max_tokens": 20, "ignore_eos": True,
            "stop_token_ids": [ids[k]], "stream": True})
        finals = [json.loads(line[6:])["choices"][0] for line in data.decode().splitlines()
                  if line.startswith("data: {") and '"finish_reason":"stop"' in line]
        assert len(finals) == 1 and finals[0]["stop_reason"] == ids[k]
