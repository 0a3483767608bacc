"""best_of on completions: best_of answers are made to each prompt and the n of highest mean
log-probability a token are returned (OpenAI's "highest log probability per token"), best
first; the usage counts every answer made. Answer c of a prompt is sampled with seed + c, as
choice c of n, so the candidates can be made visible with n = best_of and logprobs."""
import pytest

from server_util import Server

PROMPTS = ["Once upon a time", [5, 6, 7, 8, 9]]


def mean_lp(choice):
    lps = choice["logprobs"]["token_logprobs"]
    return sum(lps) / len(lps)


def test_best_of_returns_the_answers_of_highest_mean_log_probability():
    with Server() as srv:
        check_best_of(srv)


def check_best_of(srv):
    """On a server that has seen none of PROMPTS (also run on the GPU: test_server_cuda.py)."""
    body = {"prompt": PROMPTS, "max_tokens": 8, "temperature": 1.0, "seed": 5,
            "return_token_ids": True}
    r = srv.post_ok("/v1/completions", dict(body, n=2, best_of=5))
    # a new server: nothing of the prompts was cached, whichever answer now comes first
    # (the later ones start from the state of the one that prefilled)
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    every = srv.post_ok("/v1/completions", dict(body, n=5, logprobs=0))  # the candidates, in the order made
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
    reordered = False
    for p in range(len(PROMPTS)):
        cands = every["choices"][5 * p:5 * p + 5]
        score = [mean_lp(c) for c in cands]
        order = sorted(range(5), key=lambda i: -score[i])
        reordered |= order[:2] != [0, 1]
        for k in range(2):
            got = r["choices"][2 * p + k]
            assert got["token_ids"] == cands[order[k]]["token_ids"], (p, k, score)
            assert got["text"] == cands[order[k]]["text"]
            assert got["logprobs"] is None  # not asked for
    assert reordered  # the seed makes the best ones other than the first made
    # usage: each prompt once, every answer made
    assert r["usage"]["prompt_tokens"] == every["usage"]["prompt_tokens"]
    assert r["usage"]["completion_tokens"] == every["usage"]["completion_tokens"]
    # with logprobs asked for, the chosen answer's own
    r = srv.post_ok("/v1/completions", dict(body, prompt=PROMPTS[0], n=1, best_of=5, logprobs=2))
    best = max(every["choices"][:5], key=mean_lp)
    # (equal on the CPU; a GPU's sums differ in the last bits with the batch's make-up)
    assert r["choices"][0]["token_ids"] == best["token_ids"]
    assert r["choices"][0]["logprobs"]["token_logprobs"] == \
        pytest.approx(best["logprobs"]["token_logprobs"], abs=1e-3)
    assert len(r["choices"][0]["logprobs"]["top_logprobs"][0]) == 2


def test_best_of_equal_to_n_changes_nothing_and_may_stream():
    with Server() as srv:
        body = {"prompt": PROMPTS[0], "max_tokens": 6, "temperature": 1.0, "seed": 9, "n": 3,
                "return_token_ids": True}
        plain = srv.post_ok("/v1/completions", body)
        same = srv.post_ok("/v1/completions", dict(body, best_of=3))
        assert [c["token_ids"] for c in same["choices"]] == \
            [c["token_ids"] for c in plain["choices"]]
        status, _, data = srv.request("POST", "/v1/completions", dict(body, best_of=3,
                                                                       stream=True))
        assert status == 200 and data.decode().rstrip().endswith("data: [DONE]")
