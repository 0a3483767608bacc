"""llama-server's /infill: a code editor's fill in the middle with the project's other files.

The prefix, suffix, extra files and the middle's start are framed in the repo-level pattern
(<|repo_name|>myproject\\n, <|file_sep|>name\\n text for each file, <|file_sep|>filename\\n,
then <|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|> start) and run as the
completion of that frame: the checks compare an /infill request with /v1/completions given the
frame as token ids (built here from /tokenize), answer for answer, then llama-server's answer
shape (content, stop_type, tokens_*, timings), the stream (content pieces, then the whole
object; no [DONE]), the renamed fields (n_predict, repeat_penalty) and the refusals. The ids
of the small Qwen tokenizer's frame tokens are test_server_fim.py's."""
import json
import shutil

import pytest

from server_util import Server, tiny_model
from test_server_fim import MID, PRE, REPO, SEP, SUF, TEXT_ONLY, ids_of

PREFIX, SUFFIX = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
EXTRA = [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"},
         {"filename": "README.md", "text": "# math\n"}]


@pytest.fixture(scope="module")
def srv():
    with Server("--ctx", "512") as s:
        yield s


def frame(srv, prefix, suffix, extra=(), start=""):
    ids = []
    if extra:
        ids += [REPO] + ids_of(srv, "myproject\n")
        for f in extra:
            ids += [SEP] + ids_of(srv, f.get("filename", "tmp") + "\n") + ids_of(srv, f["text"])
        ids += [SEP] + ids_of(srv, "filename\n")
    ids += [PRE] + ids_of(srv, prefix) + [SUF] + ids_of(srv, suffix) + [MID]
    return ids + (ids_of(srv, start) if start else [])


def infill(srv, body):
    status, _, r = srv.post("/infill", body)
    assert status == 200, r
    return r


def completion(srv, prompt, **kw):
    status, _, r = srv.post("/v1/completions", dict(prompt=prompt, **kw))
    assert status == 200, r
    return r


def test_the_answer_is_the_frames_completion(srv):
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": EXTRA,
            "prompt": "return", "n_predict": 12, "temperature": 0, "logit_bias": TEXT_ONLY}
    r = infill(srv, body)
    ids = frame(srv, PREFIX, SUFFIX, EXTRA, "return")
    c = completion(srv, ids, max_tokens=12, temperature=0, logit_bias=TEXT_ONLY)
    assert r["content"] == c["choices"][0]["text"]
    assert r["tokens_predicted"] == c["usage"]["completion_tokens"] == 12
    assert r["tokens_evaluated"] == len(ids)
    assert r["stop"] is True and r["stop_type"] == "limit" and r["stopping_word"] == ""
    assert r["model"] == "serve-tiny" and r["truncated"] is False
    assert r["has_new_line"] == ("\n" in r["content"])
    t = r["timings"]
    assert t["predicted_n"] == 12 and t["prompt_n"] == len(ids) - r["tokens_cached"]
    assert min(t["prompt_ms"], t["predicted_ms"], t["predicted_per_second"]) >= 0
    # without extra files or a start: the frame of a completion's suffix
    r = infill(srv, {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 6,
                     "temperature": 0, "logit_bias": TEXT_ONLY})
    c = completion(srv, PREFIX, suffix=SUFFIX, max_tokens=6, temperature=0, logit_bias=TEXT_ONLY)
    assert r["content"] == c["choices"][0]["text"]
    assert r["tokens_evaluated"] == c["usage"]["prompt_tokens"]
    # the same request again: its prompt comes back from the snapshot
    again = infill(srv, {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 6,
                         "temperature": 0, "logit_bias": TEXT_ONLY})
    assert again["content"] == r["content"] and again["tokens_cached"] > 0


def test_the_stream_is_pieces_then_the_whole(srv):
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": EXTRA[:1],
            "n_predict": 16, "temperature": 0, "logit_bias": TEXT_ONLY}
    whole = infill(srv, body)
    status, hd, data = srv.request("POST", "/infill", dict(body, stream=True))
    assert status == 200 and hd["content-type"].startswith("text/event-stream")
    lines = [ln for ln in data.decode().split("\n\n") if ln]
    assert all(ln.startswith("data: {") for ln in lines), lines[-1]  # no [DONE]
    events = [json.loads(ln[6:]) for ln in lines]
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == whole["content"]
    last = events[-1]
    assert last["content"] == "" and last["tokens_predicted"] == 16
    assert last["stop_type"] == "limit"


def test_stop_words_end_of_generation_and_the_renamed_fields(srv):
    base = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "temperature": 0,
            "logit_bias": TEXT_ONLY}
    free = infill(srv, dict(base, n_predict=24))
    word = free["content"][3:5]
    assert len(word) == 2
    r = infill(srv, dict(base, n_predict=24, stop=[word]))
    assert r["stop_type"] == "word" and r["stopping_word"] == word
    assert free["content"].startswith(r["content"]) and word not in r["content"]
    # the end of generation drawn first: nothing, "eos"
    status, _, t = srv.post("/tokenize", {"content": "<|endoftext|>"})
    eos = t["tokens"][0]
    r = infill(srv, dict(base, n_predict=8, logit_bias=dict(TEXT_ONLY, **{str(eos): 100})))
    assert r["stop_type"] == "eos" and r["content"] == "" and r["tokens_predicted"] == 1
    # repeat_penalty is the completion's repetition_penalty; n_predict -1 runs to the cap
    ids = frame(srv, PREFIX, SUFFIX)
    r = infill(srv, dict(base, n_predict=20, repeat_penalty=1.5))
    c = completion(srv, ids, max_tokens=20, temperature=0, logit_bias=TEXT_ONLY,
                   repetition_penalty=1.5)
    assert r["content"] == c["choices"][0]["text"]
    with Server("--max-tokens-cap", "5") as s:
        r = infill(s, dict(base, n_predict=-1))
        assert r["tokens_predicted"] == 5 and r["stop_type"] == "limit"


def test_the_next_request_about_the_same_files_starts_from_them():
    """An editor sends the same files with each keystroke's prefix: the frame's files part is
    kept as a snapshot once it is in, and the next request prefills only its own part - with
    the answer a server without snapshots gives (--cache-mb 0)."""
    files = [{"filename": f"m{k}.py", "text": f"def f{k}(x):\n    return x * {k}\n" * 4}
             for k in range(3)]
    bodies = [{"input_prefix": p, "input_suffix": SUFFIX, "input_extra": files,
               "n_predict": 6, "temperature": 0, "logit_bias": TEXT_ONLY}
              for p in ("def add(a, b):\n    ", "def mul(a, b):\n    return", "x = f1(")]
    with Server() as s, Server("--cache-mb", "0") as plain:
        ctx = len(frame(s, "", "", files)) - len(frame(s, "", ""))  # the files' lines
        for k, body in enumerate(bodies):
            before = s.metrics()["tessera_prefill_tokens_total"]
            r, p = infill(s, body), infill(plain, body)
            assert r["content"] == p["content"]
            assert r["tokens_evaluated"] == p["tokens_evaluated"]
            assert p["tokens_cached"] == 0
            assert r["tokens_cached"] == (ctx if k else 0)
            prefilled = s.metrics()["tessera_prefill_tokens_total"] - before
            assert prefilled == r["tokens_evaluated"] - r["tokens_cached"]


def error(srv, body):
    status, _, r = srv.post("/infill", body)
    return status, r["error"]["code"], r["error"]["param"], r["error"]["message"]


def test_refusals(srv):
    assert error(srv, {"input_prefix": 5})[:3] == (400, "invalid_value", "input_prefix")
    assert error(srv, {"input_suffix": ["x"]})[:3] == (400, "invalid_value", "input_suffix")
    assert error(srv, {"prompt": 1})[:3] == (400, "invalid_value", "prompt")
    assert error(srv, {"input_extra": "x"})[:3] == (400, "invalid_value", "input_extra")
    s, c, p, m = error(srv, {"input_extra": [{"filename": "a", "text": "b"}, {"filename": "c"}]})
    assert (s, c, p) == (400, "invalid_value", "input_extra") and "input_extra[1]" in m
    assert error(srv, {"input_extra": [{"text": 3}]})[2] == "input_extra"
    assert error(srv, {"input_prefix": "x", "n": 2})[:3] == (400, "invalid_value", "n")
    assert error(srv, {"input_prefix": "x", "best_of": 3})[2] == "best_of"
    s, c, p, m = error(srv, {"input_prefix": "x", "n_predict": 0})
    assert (s, p) == (400, "n_predict") and "'n_predict'" in m and "max_tokens" not in m
    assert error(srv, {"input_prefix": "x", "repeat_penalty": -1})[2] == "repeat_penalty"
    assert error(srv, {"input_prefix": "x", "n_predict": 4, "max_tokens": 5})[2] == "n_predict"
    s, c, p, m = error(srv, {"input_prefix": "word " * 600})
    assert (s, c, p) == (400, "context_length_exceeded", "input_prefix")
    assert error(srv, {"model": "gpt-4", "input_prefix": "x"})[:3] == (
        404, "model_not_found", "model")
    assert infill(srv, {"input_prefix": "x", "n_predict": 1})["tokens_predicted"] == 1


def test_a_vocabulary_without_repository_tokens(tmp_path):
    """The frame tokens but not <|repo_name|> / <|file_sep|>: each file's text after a snippet
    line, then the frame (llama-server's fallback); none at all: refused, naming input_prefix."""
    model = tmp_path / "no-repo"
    shutil.copytree(tiny_model(), model)
    tok = json.load(open(model / "tokenizer.json", encoding="utf-8"))
    for t in tok["added_tokens"]:
        t["content"] = t["content"].replace("repo_name", "xepo").replace("file_sep", "xile")
    json.dump(tok, open(model / "tokenizer.json", "w", encoding="utf-8"))
    with Server(model=str(model)) as s:
        r = infill(s, {"input_prefix": "a", "input_extra": EXTRA[:1], "n_predict": 1})
        snippet = ids_of(s, "\n\n--- snippet ---\n\n") + ids_of(s, EXTRA[0]["text"])
        assert r["tokens_evaluated"] == len(snippet + [PRE] + ids_of(s, "a") + [SUF, MID])
    for t in tok["added_tokens"]:
        t["content"] = t["content"].replace("fim", "xim")
    json.dump(tok, open(model / "tokenizer.json", "w", encoding="utf-8"))
    with Server(model=str(model)) as s:
        s_, c, p, m = error(s, {"input_prefix": "a"})
        assert (s_, c, p) == (400, "unsupported_feature", "input_prefix")


def test_metrics_count_the_route(srv):
    key = 'tessera_requests_total{route="/infill",status="200"}'
    before = srv.metrics().get(key, 0)
    infill(srv, {"input_prefix": "x", "n_predict": 1})
    assert srv.metrics()[key] == before + 1


def test_llama_server_s_own_completion(srv):
    """POST /completion (llama-server's own, which many of its clients speak): one prompt, a
    string or token ids, llama-server's field names, answered in the shape of /infill - the
    same text as /v1/completions, whole or streamed without [DONE]; several answers or
    prompts are refused."""
    body = {"prompt": "The sea is", "n_predict": 10, "temperature": 0, "logit_bias": TEXT_ONLY,
            "cache_prompt": True, "n_probs": 0}
    r = infill_like(srv, "/completion", body)
    c = completion(srv, "The sea is", max_tokens=10, temperature=0, logit_bias=TEXT_ONLY)
    assert r["content"] == c["choices"][0]["text"]
    assert r["tokens_predicted"] == 10 and r["stop_type"] == "limit" and r["stop"] is True
    assert r["tokens_evaluated"] == c["usage"]["prompt_tokens"]
    assert r["model"] == "serve-tiny" and r["timings"]["predicted_n"] == 10
    ids = srv.post_ok("/tokenize", {"prompt": "The sea is"})["tokens"]
    assert infill_like(srv, "/completion", dict(body, prompt=ids))["content"] == r["content"]
    status, hd, data = srv.request("POST", "/completion", dict(body, stream=True))
    assert status == 200 and hd["content-type"].startswith("text/event-stream")
    lines = [ln for ln in data.decode().split("\n\n") if ln]
    assert all(ln.startswith("data: {") for ln in lines), lines[-1]  # no [DONE]
    events = [json.loads(ln[6:]) for ln in lines]
    assert "".join(e["content"] for e in events) == r["content"] and events[-1]["stop"] is True
    for bad, param in ((dict(body, n=2), "n"), (dict(body, prompt=["a", "b"]), "prompt"),
                       (dict(body, prompt=7), "prompt"), (dict(body, n_predict=0), "n_predict")):
        status, _, e = srv.post("/completion", bad)
        assert status == 400 and e["error"]["param"] == param, (bad, e)


def infill_like(srv, path, body):
    status, _, r = srv.post(path, body)
    assert status == 200, r
    return r


def test_the_openai_routes_without_v1(srv):
    """Clients whose base URL lacks /v1 send /chat/completions, /completions, /embeddings,
    /models: the same routes (llama-server and vLLM answer them too)."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
    a = srv.post_ok("/v1/chat/completions", body)
    b = srv.post_ok("/chat/completions", body)
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
    assert srv.post_ok("/completions", {"prompt": "x", "max_tokens": 2})["object"] == \
        "text_completion"
    assert srv.post_ok("/embeddings", {"input": "x"})["data"][0]["object"] == "embedding"
    status, _, m = srv.request("GET", "/models")
    assert status == 200 and json.loads(m)["data"][0]["id"] == "serve-tiny"
    status, _, m = srv.request("GET", "/models/serve-tiny")
    assert status == 200 and json.loads(m)["id"] == "serve-tiny"
    status, _, _ = srv.request("GET", "/chat/nothing")
    assert status == 404


def test_chat_answers_carry_llama_server_s_timings(srv):
    """llama-server's timings in a chat or completion's answer (its clients show the speed
    from them): counts that agree with the usage; in a stream, in each choice's final chunk."""
    body = {"messages": [{"role": "user", "content": "Timings?"}], "max_tokens": 7,
            "temperature": 0}
    r = srv.post_ok("/v1/chat/completions", body)
    t, u = r["timings"], r["usage"]
    assert t["predicted_n"] == u["completion_tokens"] == 7
    assert t["prompt_n"] == u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"]
    assert min(t["prompt_ms"], t["predicted_ms"], t["predicted_per_second"]) >= 0
    c = srv.post_ok("/v1/completions", {"prompt": "x", "max_tokens": 3})
    assert c["timings"]["predicted_n"] == 3
    status, _, data = srv.request("POST", "/v1/chat/completions", dict(body, stream=True, n=2))
    finals = [json.loads(ln[6:]) for ln in data.decode().split("\n\n")
              if ln.startswith("data: {") and '"finish_reason":"length"' in ln]
    assert len(finals) == 2 and all(f["timings"]["predicted_n"] == 7 for f in finals), finals
