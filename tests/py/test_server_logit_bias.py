"""logit_bias (OpenAI): {"token id": bias in [-100, 100]} added to those tokens' logits before
every draw of the answer, before the penalties. The checks take a server, so that the GPU's
tests (test_server_cuda.py) run them on the device's draws too."""
import math

import pytest

from server_util import Server

PROMPT = list(range(3, 40))  # token ids: the tests know which tokens the prompt holds


def complete(srv, **kw):
    body = {"prompt": PROMPT, "max_tokens": 1, "temperature": 0, "logprobs": 1,
            "return_token_ids": True}
    body.update(kw)
    status, _, r = srv.post("/v1/completions", body)
    assert status == 200, r
    return r["choices"][0]


def check_bias_moves_the_first_token(srv):
    base = complete(srv)
    (t0,) = base["token_ids"]
    lp0 = base["logprobs"]["token_logprobs"][0]
    # +100 on any token makes it the draw; -100 on the best leaves another
    other = 5 if t0 != 5 else 6
    assert complete(srv, logit_bias={str(other): 100})["token_ids"] == [other]
    assert complete(srv, logit_bias={str(t0): -100})["token_ids"] != [t0]
    # the bias is added to the logit: with b > 0 on the drawn token (still the draw) its
    # log-probability becomes lp0 + b - log(1 - p0 + p0 e^b), p0 = e^lp0
    for b in (0.25, 1.5):
        c = complete(srv, logit_bias={str(t0): b})
        assert c["token_ids"] == [t0]
        want = lp0 + b - math.log(1 - math.exp(lp0) + math.exp(lp0 + b))
        assert abs(c["logprobs"]["token_logprobs"][0] - want) < 1e-4, (b, lp0, c["logprobs"])
    # an empty object and null change nothing
    assert complete(srv, logit_bias={})["logprobs"] == base["logprobs"]
    assert complete(srv, logit_bias=None)["logprobs"] == base["logprobs"]


def check_ban_holds_through_the_answer(srv):
    """A token banned by -100 never appears in a long answer, with a repetition penalty that
    reaches it in the prompt (the bias must survive the penalty's entry for the same token)
    and with sampled draws; both decode paths (the draw where the logits are, and the logits
    brought to the server by log-probabilities) give the same tokens."""
    def run(**kw):
        body = dict(max_tokens=40, ignore_eos=True)
        body.update(kw)
        return complete(srv, **body)["token_ids"]

    def most_often(ids):
        return max(set(ids), key=ids.count)

    # a bias alone (no penalty) holds past the first token
    plain = most_often(run(logprobs=None))
    assert plain not in run(logit_bias={str(plain): -100}, logprobs=None)
    free = run(repetition_penalty=1.2, logprobs=None)
    often = most_often(free)
    in_prompt = PROMPT[5]
    ban = {str(often): -100, str(in_prompt): -100}
    for extra in ({}, {"temperature": 1.0, "seed": 5}):
        a = run(repetition_penalty=1.2, logit_bias=ban, logprobs=None, **extra)
        b = run(repetition_penalty=1.2, logit_bias=ban, **extra)
        assert often not in a and in_prompt not in a, (often, in_prompt, a)
        assert a == b
    # a favoured token of the prompt: +100 makes every greedy draw that token, the penalties
    # notwithstanding ((l + 100) / 1.5 - 0.5 * count stays far above the others)
    assert set(run(logit_bias={str(in_prompt): 100}, repetition_penalty=1.5,
                   frequency_penalty=0.5, logprobs=None)) == {in_prompt}


@pytest.fixture(scope="module")
def srv():
    with Server() as s:
        yield s


def test_bias_moves_the_first_token(srv):
    check_bias_moves_the_first_token(srv)


def test_ban_holds_through_the_answer(srv):
    check_ban_holds_through_the_answer(srv)


def test_chat_takes_logit_bias(srv):
    body = {"messages": [{"role": "user", "content": "Tell me a story."}], "temperature": 0,
            "max_tokens": 8, "return_token_ids": True}
    status, _, free = srv.post("/v1/chat/completions", body)
    assert status == 200, free
    first = free["choices"][0]["token_ids"][0]
    status, _, r = srv.post("/v1/chat/completions", dict(body, logit_bias={str(first): -100}))
    assert status == 200, r
    assert first not in r["choices"][0]["token_ids"]
