"""echo on completions: the answer's text starts with the prompt's, and with logprobs the
prompt's tokens are scored too (the first has none) - with max_tokens 0, a text's
log-likelihood, as evaluation harnesses ask for it. The checks take a server, so that the
GPU's tests (test_server_cuda.py) run them on the device too."""
import json

import pytest

from server_util import Server


def complete(srv, body):
    status, _, r = srv.post("/v1/completions", body)
    assert status == 200, r
    return r["choices"][0]


def check_prompt_scores_match_the_answers(srv, tol):
    """The prompt's log-probabilities are the ones the same tokens got when they were drawn:
    a greedy answer fed back as a prompt scores as it was generated. The prompt is long
    enough to be scored over three prefill calls (SERVE_ECHO_ROWS tokens a call)."""
    prompt = [(7 * i) % 900 + 20 for i in range(124)]
    g = complete(srv, {"prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 0,
                       "return_token_ids": True, "ignore_eos": True})
    ids, lps = g["token_ids"], g["logprobs"]["token_logprobs"]
    e = complete(srv, {"prompt": prompt + ids, "max_tokens": 0, "echo": True, "logprobs": 1})
    got = e["logprobs"]["token_logprobs"]
    assert len(got) == len(prompt) + len(ids) and got[0] is None
    assert e["logprobs"]["top_logprobs"][0] is None
    assert all(x is not None and x < 0 for x in got[1:])  # every position scored
    for k, want in enumerate(lps):
        assert abs(got[len(prompt) + k] - want) < tol, (k, got[len(prompt) + k], want)
    assert e["finish_reason"] == "length"
    assert e["text"] == complete(srv, {"prompt": prompt + ids, "max_tokens": 0,
                                       "echo": True})["text"]


@pytest.fixture(scope="module")
def srv():
    with Server() as s:
        yield s


def test_prompt_scores_match_the_answers(srv):
    check_prompt_scores_match_the_answers(srv, 1e-4)


def test_echo_text_and_answer(srv):
    body = {"prompt": "The sea is blue and", "max_tokens": 6, "temperature": 0, "logprobs": 2}
    plain = complete(srv, body)
    e = complete(srv, dict(body, echo=True))
    assert e["text"] == "The sea is blue and" + plain["text"]
    lp = e["logprobs"]
    n_answer = len(plain["logprobs"]["tokens"])
    assert lp["tokens"][-n_answer:] == plain["logprobs"]["tokens"]
    # the same tokens, scored alike: the echo's last prompt row comes from the output head run
    # over every prompt row (the matrix kernel), the plain answer's from the head run over that
    # row alone (the vector kernel), whose sums round apart in the last bits on a CPU without
    # AVX-512 (5e-7 seen on an AVX2 one)
    for a, b in zip(lp["token_logprobs"][-n_answer:], plain["logprobs"]["token_logprobs"]):
        assert abs(a - b) < 1e-5, (a, b)
    assert "".join(lp["tokens"][:-n_answer]) == "The sea is blue and"
    # without logprobs, and a prompt of ids (its text is the ids' text)
    assert complete(srv, dict(body, echo=True, logprobs=None))["text"] == e["text"]
    status, _, t = srv.post("/tokenize", {"content": "The sea is blue and"})
    ids = complete(srv, {"prompt": t["tokens"], "max_tokens": 0, "echo": True})
    assert ids["text"] == "The sea is blue and"


def test_echo_streams_the_prompt_first(srv):
    body = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "echo": True,
            "logprobs": 1, "n": 2}
    whole = json.dumps(srv.post("/v1/completions", body)[2])
    status, _, data = srv.request("POST", "/v1/completions", dict(body, stream=True))
    assert status == 200
    text, lps, first = {}, {}, {}
    for line in data.decode().splitlines():
        if line.startswith("data: {"):
            for ch in json.loads(line[6:])["choices"]:
                i = ch["index"]
                first.setdefault(i, ch["text"])
                text[i] = text.get(i, "") + ch["text"]
                if ch["logprobs"]:
                    lps.setdefault(i, []).extend(ch["logprobs"]["token_logprobs"])
    w = json.loads(whole)["choices"]
    for i in (0, 1):
        assert first[i] == "Once upon a time"
        assert text[i] == w[i]["text"]
        assert lps[i] == w[i]["logprobs"]["token_logprobs"]


def test_max_tokens_0_only_with_echo(srv):
    status, _, e = srv.post("/v1/completions", {"prompt": "x", "max_tokens": 0})
    assert status == 400 and e["error"]["param"] == "max_tokens"
    status, _, e = srv.post("/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0,
                             "echo": True})
    assert status == 400 and e["error"]["param"] == "max_tokens"
