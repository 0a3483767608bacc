"""Speculative decoding with the model's multi-token-prediction block (--draft-mtp N): the
block guesses up to N tokens a step and the model checks them in the step. The answer must be
the one the server gives without guesses - greedy, sampled from a seed, with penalties and
log-probabilities, several requests at once - in fewer decode steps, since the fixture's block
was trained on the model's own continuations (tests/fixtures/qwen35_mtp). A model without the
block, or N above --draft-max, is refused at start."""
import os
import shutil
import tempfile
import threading

import pytest

from server_util import Server, fixtures, tiny_model


def read_ids(path, line):
    with open(path) as f:
        return [int(x) for x in f.read().splitlines()[line].split()]


def mtp_model(tmp):
    """The fixture's model with a tokenizer beside it (its vocabulary holds the tokenizer's),
    in a directory under tmp."""
    src = os.path.join(fixtures(), "qwen35_mtp", "tiny_mtp")
    dst = os.path.join(tmp, "tiny_mtp")
    os.makedirs(dst)
    for f in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(src, f), dst)
    shutil.copy(os.path.join(fixtures(), "tokenizer", "small", "tokenizer.json"), dst)
    return dst


@pytest.fixture(scope="module")
def model():
    with tempfile.TemporaryDirectory() as tmp:
        yield mtp_model(tmp)


@pytest.fixture(scope="module")
def prompt():
    return read_ids(os.path.join(fixtures(), "qwen35_mtp", "tiny_mtp", "ref", "greedy.ids"), 0)


@pytest.fixture(scope="module")
def mtp(model):
    with Server("--draft-mtp", "2", "--cache-mb", "0", model=model) as s:
        yield s


@pytest.fixture(scope="module")
def plain(model):
    with Server("--draft-max", "0", "--cache-mb", "0", model=model) as s:
        yield s


def complete(s, prompt, **kw):
    body = {"prompt": prompt, "temperature": 0, "max_tokens": 48, "ignore_eos": True,
            "return_token_ids": True, **kw}
    return s.post_ok("/v1/completions", body)


def test_the_model_answers_as_transformers(plain, prompt):
    want = read_ids(os.path.join(fixtures(), "qwen35_mtp", "tiny_mtp", "ref", "greedy.ids"), 1)
    assert complete(plain, prompt)["choices"][0]["token_ids"] == want


def test_greedy_answer_is_the_same_in_fewer_steps(mtp, plain, prompt):
    base = complete(plain, prompt)["choices"][0]["token_ids"]
    before = mtp.metrics()
    r = complete(mtp, prompt)
    after = mtp.metrics()
    assert r["choices"][0]["token_ids"] == base
    steps = after["tessera_decode_calls_total"] - before["tessera_decode_calls_total"]
    guessed = after["tessera_draft_tokens_total"] - before["tessera_draft_tokens_total"]
    taken = after["tessera_draft_accepted_total"] - before["tessera_draft_accepted_total"]
    d = r["usage"]["completion_tokens_details"]
    assert d["accepted_prediction_tokens"] == taken
    assert d["accepted_prediction_tokens"] + d["rejected_prediction_tokens"] == guessed
    # the first token comes from the prompt's logits, the other 47 from decode steps: one a
    # step and one more for each right guess; the trained block gets most of them right
    assert steps == 47 - taken, (steps, taken)
    assert taken >= 20, (taken, guessed)


SAMPLED = [
    {"temperature": 0.8, "seed": 5},
    {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "seed": 6, "frequency_penalty": 0.5},
    {"temperature": 0, "repetition_penalty": 1.2, "logprobs": 3},
]


@pytest.mark.parametrize("kw", SAMPLED)
def test_draws_are_the_ones_without_guesses(mtp, plain, prompt, kw):
    base = complete(plain, prompt, **kw)["choices"][0]
    got = complete(mtp, prompt, **kw)["choices"][0]
    assert got["token_ids"] == base["token_ids"]
    if "logprobs" in kw:
        assert [round(x, 4) for x in got["logprobs"]["token_logprobs"]] == \
            [round(x, 4) for x in base["logprobs"]["token_logprobs"]]


def test_requests_at_once_each_as_alone(mtp, plain, prompt):
    prompts = [prompt, prompt[3:], prompt[:7] + prompt[:5]]
    want = [complete(plain, p)["choices"][0]["token_ids"] for p in prompts]
    got = [None] * len(prompts)

    def run(i):
        got[i] = complete(mtp, prompts[i])["choices"][0]["token_ids"]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want


def test_with_prompt_lookup_and_prefix_reuse(model, plain, prompt):
    """Prompt lookup guesses first where it finds something, the block elsewhere; a follow-up
    that reuses a snapshot of the prompt (its block rows with it) answers as the plain server."""
    base = complete(plain, prompt)["choices"][0]["token_ids"]
    with Server("--draft-mtp", "2", "--draft-lookup", model=model) as s:
        assert complete(s, prompt)["choices"][0]["token_ids"] == base
        r = complete(s, prompt)
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert r["choices"][0]["token_ids"] == base


def test_refused_at_start(model):
    with tempfile.TemporaryDirectory() as tmp:  # a Qwen3.5 model without the block
        shutil.copytree(os.path.join(fixtures(), "qwen35", "tiny_a_f32_tied_explicit"), tmp,
                        dirs_exist_ok=True)
        shutil.copy(os.path.join(fixtures(), "tokenizer", "small", "tokenizer.json"), tmp)
        with pytest.raises(RuntimeError, match="has no multi-token-prediction block"):
            Server("--draft-mtp", "1", model=tmp)
    with pytest.raises(RuntimeError, match="draft-mtp"):
        Server("--draft-mtp", "9", "--draft-max", "8", model=model)
    # a model with the block works without the flag, as any other
    with Server(model=tiny_model()) as s:
        assert s.post_ok("/v1/completions", {"prompt": "hi", "max_tokens": 2})
