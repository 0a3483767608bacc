"""POST /v1/embeddings: OpenAI's embeddings API on the tiny Qwen3.5.

Each input's vector is checked against an independent float64 numpy forward of the same
checkpoint (tools/qwen35_numpy_ref.py): the final norm's output at the last token (the
default pooling) or its mean over the tokens (--pooling mean), scaled to unit length. Then:
several inputs (shared out over the lanes) keep their order and their vectors; base64 is the
float32 bytes; a long input cut into chunks gives the vector of one piece; embeddings and
chats run together without changing either; the refusals (empty, out of the vocabulary, over
the context - never cut -, bad encoding_format / dimensions / model) come in a fixed order;
admission refuses at once when full, a client that leaves cancels its inputs, and the OpenAI
client reads the answer."""
import base64
import os
import socket
import sys
import threading
import time

import numpy as np
import pytest

from server_util import REPO, Server, chat, raw

sys.path.insert(0, os.path.join(REPO, "tools"))
import qwen35_numpy_ref as ref  # noqa: E402

TEXTS = ["The sea is wide.", "hello", "Once upon a time there was a small town by the river."]


@pytest.fixture(scope="module")
def srv():
    with Server("--ctx", "96") as s:
        yield s


@pytest.fixture(scope="module")
def model(srv):
    return ref.load(srv.model)


def ids_of(srv, text):
    return srv.post_ok("/tokenize", {"content": text})["tokens"]


def want(model, ids, mean=False):
    h = ref.hidden(model, ids)
    v = h.mean(0) if mean else h[-1]
    return v / np.linalg.norm(v)


def vectors(r):
    assert r["object"] == "list"
    assert [d["index"] for d in r["data"]] == list(range(len(r["data"])))
    assert all(d["object"] == "embedding" for d in r["data"])
    return [np.array(d["embedding"], dtype=np.float64) for d in r["data"]]


def close(got, exp, tol=2e-5):
    """float32 engine against float64 numpy: |Δ| of a unit vector."""
    assert got.shape == exp.shape
    err = np.linalg.norm(got - exp)
    assert err < tol, f"|Δ| {err:.2e}"


def test_last_token_pooling_matches_the_reference(srv, model):
    for text in TEXTS:
        r = srv.post_ok("/v1/embeddings", {"input": text, "model": "serve-tiny"})
        ids = ids_of(srv, text)
        (v,) = vectors(r)
        assert v.shape == (model["cfg"]["hidden_size"],)
        close(v, want(model, ids))
        assert abs(np.linalg.norm(v) - 1) < 1e-5
        assert r["usage"] == {"prompt_tokens": len(ids), "total_tokens": len(ids)}
        assert r["model"] == "serve-tiny"
    # token ids in, as a list and as a list of lists
    ids = [5, 17, 300, 42, 7, 99, 1000, 3]
    (v,) = vectors(srv.post_ok("/v1/embeddings", {"input": ids}))
    close(v, want(model, ids))
    a, b = vectors(srv.post_ok("/v1/embeddings", {"input": [ids, ids[:3]]}))
    close(a, want(model, ids))
    close(b, want(model, ids[:3]))


def test_mean_pooling_matches_the_reference(model):
    with Server("--pooling", "mean") as s:
        for text in TEXTS:
            (v,) = vectors(s.post_ok("/v1/embeddings", {"input": text}))
            close(v, want(model, ids_of(s, text), mean=True))
        # the last token's vector is not the mean's: the flag is what chose
        (v,) = vectors(s.post_ok("/v1/embeddings", {"input": TEXTS[2]}))
        assert np.linalg.norm(v - want(model, ids_of(s, TEXTS[2]))) > 1e-2
        # lanes taken again (4 of them): each input's sums start from zero, not from the
        # lane's last input's
        for text in TEXTS * 2:
            (v,) = vectors(s.post_ok("/v1/embeddings", {"input": text}))
            close(v, want(model, ids_of(s, text), mean=True))


def test_many_inputs_keep_their_order_and_vectors(srv, model):
    texts = [f"{TEXTS[i % 3]} number {i}" for i in range(23)]
    r = srv.post_ok("/v1/embeddings", {"input": texts})
    got = vectors(r)
    assert len(got) == len(texts)
    total = 0
    for t, v in zip(texts, got):
        ids = ids_of(srv, t)
        total += len(ids)
        close(v, want(model, ids))
    assert r["usage"]["prompt_tokens"] == total
    # the same text twice in a request, and alone: one vector
    a, b = vectors(srv.post_ok("/v1/embeddings", {"input": [texts[4], texts[4]]}))
    (c,) = vectors(srv.post_ok("/v1/embeddings", {"input": texts[4]}))
    assert np.abs(a - b).max() < 1e-6 and np.abs(a - c).max() < 1e-6


def test_base64_is_the_float32_bytes(srv):
    f = srv.post_ok("/v1/embeddings", {"input": TEXTS, "encoding_format": "float"})
    b = srv.post_ok("/v1/embeddings", {"input": TEXTS, "encoding_format": "base64"})
    for df, db in zip(f["data"], b["data"]):
        v = np.frombuffer(base64.b64decode(db["embedding"]), dtype="<f4")
        assert np.array_equal(v, np.array(df["embedding"], dtype=np.float32))


def test_a_long_input_in_chunks_is_one_piece(model):
    """--prefill-chunk 8: a 90-token input goes in in 12 forward calls; the last token's state
    and the mean over all of them are those of one call."""
    ids = [(i * 37 + 11) % 4000 for i in range(90)]
    for pooling in ("last", "mean"):
        with Server("--prefill-chunk", "8", "--pooling", pooling) as s:
            before = s.metrics()["tessera_prefill_calls_total"]
            (v,) = vectors(s.post_ok("/v1/embeddings", {"input": ids}))
            assert s.metrics()["tessera_prefill_calls_total"] - before == 12
            close(v, want(model, ids, mean=pooling == "mean"))


def test_embeddings_and_chats_run_together(srv, model):
    check_embeddings_beside_a_chat(srv, model)


def check_embeddings_beside_a_chat(srv, model, tol=2e-5):
    body = chat("Tell me about the sea.", max_tokens=24, temperature=0)
    alone = srv.post_ok("/v1/chat/completions", body)["choices"][0]["message"]["content"]
    texts = [f"input {i} " + TEXTS[2] * 2 for i in range(12)]
    out = {}

    def embed():
        out["e"] = srv.post_ok("/v1/embeddings", {"input": texts})

    def talk():
        out["c"] = srv.post_ok("/v1/chat/completions", body)

    ts = [threading.Thread(target=embed), threading.Thread(target=talk)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert out["c"]["choices"][0]["message"]["content"] == alone
    for t, v in zip(texts, vectors(out["e"])):
        close(v, want(model, ids_of(srv, t)), tol)


def error(srv, body):
    status, _, r = srv.post("/v1/embeddings", body)
    return status, r["error"]["code"], r["error"]["param"], r["error"]["message"]


def test_refusals(srv):
    n_embd = 64
    assert error(srv, {}) [:3] == (400, "invalid_value", "input")
    assert error(srv, {"input": None})[:3] == (400, "invalid_value", "input")
    assert error(srv, {"input": 5})[:3] == (400, "invalid_value", "input")
    assert error(srv, {"input": {"a": 1}})[:3] == (400, "invalid_value", "input")
    assert error(srv, {"input": ""})[:3] == (400, "invalid_value", "input")
    assert error(srv, {"input": []})[:3] == (400, "invalid_value", "input")
    assert error(srv, {"input": ["a", ""]})[3].startswith("input[1]")
    assert error(srv, {"input": [[1, 2], []]})[3].startswith("input[1]")
    assert error(srv, {"input": ["a", 3]})[:3] == (400, "invalid_value", "input")
    assert error(srv, {"input": [1, -2]})[:3] == (400, "invalid_value", "input")
    s, c, p, m = error(srv, {"input": [[1, 2], [3, 4096]]})
    assert (s, c, p) == (400, "invalid_value", "input") and "4096" in m and "input[1]" in m
    assert error(srv, {"input": ["x"] * 2049})[:3] == (400, "invalid_value", "input")
    assert error(srv, {"input": "x", "encoding_format": "int8"})[:3] == (
        400, "invalid_value", "encoding_format")
    assert error(srv, {"input": "x", "dimensions": 0})[:3] == (400, "invalid_value", "dimensions")
    assert error(srv, {"input": "x", "dimensions": 32})[:3] == (
        400, "unsupported_feature", "dimensions")
    assert srv.post_ok("/v1/embeddings", {"input": "x", "dimensions": n_embd})
    assert error(srv, {"input": "x", "model": "gpt-4"})[:3] == (404, "model_not_found", "model")
    # the order: model, then input, then encoding_format, then dimensions
    assert error(srv, {"model": "gpt-4", "input": 5, "encoding_format": 1})[2] == "model"
    assert error(srv, {"input": 5, "encoding_format": 1, "dimensions": 0})[2] == "input"
    assert error(srv, {"input": "x", "encoding_format": 1, "dimensions": 0})[2] == "encoding_format"
    status, _, data = srv.request("POST", "/v1/embeddings", '{"input": ["a",')
    assert status == 400
    # GET is not the method
    status, _, _ = srv.request("GET", "/v1/embeddings")
    assert status == 405


def test_an_input_over_the_context_is_refused_not_cut(srv, model):
    """--ctx 96: 96 tokens are embedded, 97 refused (with the input named), never cut."""
    ids = [(i * 13 + 5) % 4000 for i in range(97)]
    (v,) = vectors(srv.post_ok("/v1/embeddings", {"input": ids[:96]}))
    close(v, want(model, ids[:96]))
    s, c, p, m = error(srv, {"input": [ids[:5], ids]})
    assert (s, c, p) == (400, "context_length_exceeded", "input")
    assert "input[1]" in m and "97" in m and "96" in m
    # the server goes on
    assert srv.post_ok("/v1/embeddings", {"input": "after"})


def test_admission_is_refused_at_once_when_full():
    """--max-pending 1: while one slow embedding runs, another request is refused at once."""
    with Server("--max-pending", "1", "--prefill-chunk", "4", "--debug-step-delay-ms", "100") as s:
        ids = list(range(10, 50))  # 10 calls of 100 ms
        out = {}
        t = threading.Thread(target=lambda: out.update(r=s.post("/v1/embeddings", {"input": ids})))
        t.start()
        deadline = time.time() + 10
        while s.metrics()["tessera_running"] < 1 and time.time() < deadline:
            time.sleep(0.01)
        t0 = time.time()
        status, hd, r = s.post("/v1/embeddings", {"input": "x"})
        assert status == 503 and r["error"]["code"] == "server_busy"
        assert time.time() - t0 < 0.5
        t.join(30)
        assert out["r"][0] == 200


def test_a_client_that_leaves_cancels_its_inputs():
    with Server("--prefill-chunk", "4", "--debug-step-delay-ms", "100") as s:
        ids = list(range(10, 90))  # 20 calls of 100 ms
        body = ('{"input": %s}' % ids).encode()
        c = socket.create_connection(("127.0.0.1", s.port))
        c.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        deadline = time.time() + 10
        while s.metrics()["tessera_running"] < 1 and time.time() < deadline:
            time.sleep(0.01)
        c.close()
        t0 = time.time()
        while s.metrics()["tessera_running"] > 0 and time.time() < deadline:
            time.sleep(0.02)
        assert time.time() - t0 < 1.5, "the inputs ran on after the client left"
        m = s.metrics()
        assert m["tessera_cancelled_total"] >= 1
        assert m["tessera_prefill_tokens_total"] < len(ids)
        assert s.post_ok("/v1/embeddings", {"input": "next"})


def test_the_openai_client(srv, model):
    client = srv.client()
    r = client.embeddings.create(model="serve-tiny", input=TEXTS)  # base64 by default
    assert len(r.data) == 3
    for t, d in zip(TEXTS, r.data):
        close(np.array(d.embedding), want(model, ids_of(srv, t)))
    r = client.embeddings.create(model="serve-tiny", input="hello", encoding_format="float")
    close(np.array(r.data[0].embedding), want(model, ids_of(srv, "hello")))
    assert r.usage.prompt_tokens == len(ids_of(srv, "hello"))


def test_metrics_count_the_route(srv):
    before = srv.metrics().get('tessera_requests_total{route="/v1/embeddings",status="200"}', 0)
    srv.post_ok("/v1/embeddings", {"input": "count me"})
    after = srv.metrics()['tessera_requests_total{route="/v1/embeddings",status="200"}']
    assert after == before + 1
