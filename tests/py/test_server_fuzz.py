"""Robustness: thousands of malformed requests (random bytes, truncated and deeply nested JSON,
huge numbers, invalid UTF-8, wrong types in every field, garbage on the socket) never crash
the server and never get a 500; it still answers /health afterwards."""
import http.client
import json
import random

import pytest

from server_util import Server, raw

FIELDS = ["model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
          "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
          "frequency_penalty", "repetition_penalty", "stop", "logprobs", "top_logprobs", "n",
          "response_format", "chat_template_kwargs", "reasoning_effort", "ignore_eos",
          "return_token_ids", "tools", "logit_bias"]
WRONG = [None, True, False, 0, -1, 1.5, -1e308, 1e308, 2**63, -2**63, "", "x" * 300, "\u0000",
         [], [None], [1, "a"], {}, {"type": 5}, {"include_usage": "yes"},
         {"enable_thinking": [1]}, [{"role": "user"}], [{"role": "user", "content": None}],
         [{"role": "user", "content": [{"type": "text"}]}], [{"content": "x"}], "none",
         [[[[]]]]]
BASE = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
OK = {200, 400, 404, 413, 415}


class Conn:
    def __init__(self, port):
        self.port = port
        self.c = None

    def post(self, path, body, ctype="application/json"):
        for attempt in range(2):
            try:
                if self.c is None:
                    self.c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                self.c.request("POST", path, body=body, headers={"Content-Type": ctype})
                r = self.c.getresponse()
                data = r.read()
                if r.getheader("Connection", "").lower() == "close":
                    self.c.close()
                    self.c = None
                return r.status, data
            except (http.client.HTTPException, ConnectionError):
                self.c = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


def check(status, data, what):
    assert status in OK, (status, what[:200], data[:300])
    if status != 200:
        e = json.loads(data)["error"]
        assert e["code"] and e["message"], data


@pytest.fixture(scope="module")
def srv():
    with Server("--max-tokens-cap", "4", "--max-body-kb", "256") as s:
        yield s


def test_wrong_types_in_every_field(srv):
    c = Conn(srv.port)
    n = 0
    for f in FIELDS:
        for v in WRONG:
            for path in ("/v1/chat/completions", "/v1/completions"):
                body = dict(BASE, prompt="hi") if path == "/v1/completions" else dict(BASE)
                body[f] = v
                if f == "messages" and path == "/v1/completions":
                    body["prompt"] = v
                st, data = c.post(path, json.dumps(body))
                check(st, data, f"{f}={v!r}")
                n += 1
    # and inside a message
    for key in ("role", "content", "reasoning_content", "tool_calls", "name"):
        for v in WRONG:
            body = dict(BASE, messages=[{"role": "user", "content": "x", key: v}])
            st, data = c.post("/v1/chat/completions", json.dumps(body))
            check(st, data, f"message.{key}={v!r}")
            n += 1
    assert n > 1400


def test_random_and_broken_bodies(srv):
    rng = random.Random(1234)
    c = Conn(srv.port)
    valid = json.dumps(dict(BASE, temperature=0.5, stop=["a"], seed=3)).encode()
    bodies = []
    for i in range(400):
        bodies.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))))
    for i in range(len(valid)):
        bodies.append(valid[:i])                       # every truncation
    for d in (60, 65, 500, 5000, 50000):
        bodies.append(b"[" * d + b"]" * d)
        bodies.append(b'{"a":' * d + b"1" + b"}" * d)
        bodies.append(b"[" * d)
    for num in (b"1e400", b"-1e400", b"123456789012345678901234567890", b"NaN", b"Infinity",
                b"0x10", b"-0", b"1e-400", b"00012"):
        bodies.append(b'{"messages":[{"role":"user","content":"x"}],"max_tokens":' + num + b"}")
        bodies.append(b'{"messages":[{"role":"user","content":"x"}],"temperature":' + num + b"}")
    for bad in (b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82",
                b"\\ud800", b"\\udc00x", b"\\u0000"):
        bodies.append(b'{"messages":[{"role":"user","content":"a' + bad + b'b"}],"max_tokens":1}')
        bodies.append(b'{"prompt":"' + bad + b'","max_tokens":1}')
        bodies.append(b'{"content":"' + bad + b'"}')
    for i in range(300):                              # random mutations of a valid body
        b = bytearray(valid)
        for _ in range(rng.randrange(1, 6)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        bodies.append(bytes(b))
    n = 0
    for b in bodies:
        for path in ("/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"):
            st, data = c.post(path, b)
            check(st, data, repr(b[:80]))
            n += 1
    assert n > 3000
    assert srv.request("GET", "/health")[0] == 200


def test_garbage_on_the_socket(srv):
    rng = random.Random(99)
    cases = [b"", b"\r\n\r\n", b"GET\r\n\r\n", b"POST / HTTP/9.9\r\n\r\n",
             b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
             b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
             b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: 100\r\n\r\n{\"prompt\":",
             b"GET /" + b"a" * 100000 + b" HTTP/1.1\r\n\r\n"]
    cases += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 500))) for _ in range(60)]
    for data in cases:
        out = raw(srv.port, data, timeout=5)
        if out:
            assert not out.startswith(b"HTTP/1.1 500"), out[:200]
    assert srv.request("GET", "/health")[0] == 200


def test_no_500_recorded(srv):
    m = srv.metrics()
    assert not [k for k in m if 'status="500"' in k], m
    assert m["tessera_job_errors_total"] == 0
