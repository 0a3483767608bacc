#!/usr/bin/env python3
"""A soak of `tessera serve`: many clients for a while, each drawing requests at random from a
mix of what real clients send - chats (streamed or not, several answers, log-probabilities,
stop strings, predicted outputs), conversations that go on turn after turn, raw completions,
structured output (JSON Schema, regular expressions, GBNF, best_of), forced tool calls,
embeddings, fill in the middle, pictures (a model with a vision tower), the Responses and
Messages APIs, tokenizing - and of what they
do wrong or give up on: clients that leave mid-stream or before the answer, malformed JSON,
oversized and truncated bodies, prompts longer than the context, garbage bytes, unknown routes.

Every answer is checked for what it must be (status, shape, a stream that ends with [DONE],
JSON that parses, calls of the offered tools, unit-length embeddings); 503 from a full queue
is allowed. At the end the server must be idle (nothing running or queued), answer a fixed
greedy request exactly as it did before the soak, and - where its process id is given - its
resident memory is sampled to show whether it grows.

    python3 bench/serve_soak.py --url http://127.0.0.1:8080 --seconds 600 --clients 8 [--pid PID]

Exits 1 when any check failed. The server tests run it for a short while (test_server_soak.py).
"""
import argparse
import base64
import http.client
import json
import math
import os
import random
import socket
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "py"))
from server_util import png  # noqa: E402


class Failure(Exception):
    pass


class Soak:
    def __init__(self, url, seconds, clients, seed=1, pid=None, embeddings=True):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port
        self.seconds, self.clients, self.seed, self.pid = seconds, clients, seed, pid
        self.embeddings = embeddings
        self.lock = threading.Lock()
        self.counts = {}     # op -> [done, refused with 503]
        self.failures = []   # (op, message)
        self.rss = []        # (seconds since start, MB)
        self.ctx = None
        self.model = None
        self.vision = False

    # ---- HTTP ----------------------------------------------------------------------------

    def conn(self, timeout=120):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def call(self, method, path, body=None, raw=None, headers=None):
        """(status, headers, bytes) of one request; body is JSON, raw is sent as it is."""
        c = self.conn()
        try:
            data = raw if raw is not None else (json.dumps(body).encode() if body is not None
                                                else None)
            h = {"Content-Type": "application/json"} if data is not None else {}
            h.update(headers or {})
            c.request(method, path, body=data, headers=h)
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()

    def post(self, path, body):
        st, hd, data = self.call("POST", path, body)
        try:
            js = json.loads(data) if data else None
        except ValueError:
            raise Failure(f"{path}: status {st}, not JSON: {data[:200]!r}")
        return st, hd, js

    def expect_ok(self, op, st, hd, js):
        """True for a 200; False for the 503 of a full queue (counted); a Failure otherwise."""
        if st == 503:
            if "retry-after" not in hd:
                raise Failure(f"503 without Retry-After: {js}")
            with self.lock:
                self.counts.setdefault(op, [0, 0])[1] += 1
            return False
        if st != 200:
            raise Failure(f"status {st}: {json.dumps(js)[:300]}")
        return True

    def expect_error(self, st, js, statuses):
        if st not in statuses:
            raise Failure(f"status {st}, wanted one of {statuses}: {json.dumps(js)[:300]}")
        if not (isinstance(js, dict) and isinstance(js.get("error"), dict) and
                js["error"].get("message")):
            raise Failure(f"an error without a message: {js}")

    def stream(self, path, body, leave_after=None, events_only=False):
        """POSTs a streaming request and reads its events; with leave_after, closes the
        connection after that many. Returns (status, events) - events the parsed data lines."""
        c = self.conn()
        try:
            c.request("POST", path, body=json.dumps(body).encode(),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                data = r.read()
                return r.status, json.loads(data) if data else None
            events, done = [], False
            for line in r:
                line = line.decode().rstrip("\r\n")
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                events.append(json.loads(line[6:]))
                if leave_after is not None and len(events) >= leave_after:
                    return 200, events  # the client goes away
            if leave_after is None and not done and not events_only and path != "/v1/messages":
                raise Failure(f"{path}: the stream ended without [DONE] after {len(events)} events")
            return 200, events
        finally:
            c.close()

    # ---- the mix -------------------------------------------------------------------------

    def words(self, rng, n):
        pool = ["the", "sea", "model", "answer", "quick", "river", "token", "cache", "Paris",
                "seven", "blue", "why", "how", "café", "日本", "is", "a", "of", "write"]
        return " ".join(rng.choice(pool) for _ in range(n))

    def sampling(self, rng):
        s = {"max_tokens": rng.randint(1, 24)}
        if rng.random() < 0.5:
            s.update(temperature=rng.choice([0.7, 1.0]), top_p=rng.choice([0.9, 1.0]),
                     seed=rng.randint(0, 1 << 30))
        else:
            s["temperature"] = 0
        return s

    def op_chat(self, rng, state):
        body = dict(self.sampling(rng), messages=[{"role": "user", "content": self.words(rng, 8)}])
        if rng.random() < 0.3:
            body["n"] = 2
        if rng.random() < 0.3:
            body.update(logprobs=True, top_logprobs=rng.randint(0, 3))
        if rng.random() < 0.2:
            body["stop"] = ["the", "\n"]
        st, hd, js = self.post("/v1/chat/completions", body)
        if not self.expect_ok("chat", st, hd, js):
            return
        if len(js["choices"]) != body.get("n", 1):
            raise Failure(f"{len(js['choices'])} choices for n={body.get('n', 1)}")
        for ch in js["choices"]:
            if ch["finish_reason"] not in ("stop", "length"):
                raise Failure(f"finish_reason {ch['finish_reason']}")
            if body.get("logprobs") and ch["logprobs"] is None:
                raise Failure("no logprobs")
        if js["usage"]["completion_tokens"] > body["max_tokens"] * body.get("n", 1):
            raise Failure(f"usage {js['usage']} beyond max_tokens {body['max_tokens']}")

    def op_stream(self, rng, state, leave=False):
        body = dict(self.sampling(rng), stream=True,
                    messages=[{"role": "user", "content": self.words(rng, 6)}])
        body["max_tokens"] += 8
        st, events = self.stream("/v1/chat/completions", body,
                                 leave_after=rng.randint(1, 3) if leave else None)
        if st == 503:
            with self.lock:
                self.counts.setdefault("stream", [0, 0])[1] += 1
            return
        if st != 200:
            raise Failure(f"status {st}: {events}")
        if not leave and not any(e["choices"] and e["choices"][0].get("finish_reason")
                                 for e in events):
            raise Failure("a stream without a finish_reason")

    def op_leave(self, rng, state):
        """Sends a whole request and goes away before the answer."""
        body = {"messages": [{"role": "user", "content": self.words(rng, 5)}], "max_tokens": 64}
        data = json.dumps(body).encode()
        s = socket.create_connection((self.host, self.port), timeout=10)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: " + str(len(data)).encode() +
                  b"\r\n\r\n" + data)
        time.sleep(rng.random() * 0.05)
        s.close()

    def op_conversation(self, rng, state):
        conv = state.setdefault("conv", [])
        if len(conv) > 8:
            conv.clear()
        conv.append({"role": "user", "content": self.words(rng, 5)})
        body = {"messages": conv, "max_tokens": rng.randint(2, 12), "temperature": 0}
        st, hd, js = self.post("/v1/chat/completions", body)
        if not self.expect_ok("conversation", st, hd, js):
            conv.pop()
            return
        answer = js["choices"][0]["message"]["content"] or ""
        if "\0" in answer:  # a byte token 0x00: the server takes no U+0000 back (docs/API.md)
            conv.clear()
            return
        conv.append({"role": "assistant", "content": answer})

    def op_completion(self, rng, state):
        body = dict(self.sampling(rng), prompt=[self.words(rng, 4), self.words(rng, 3)])
        if rng.random() < 0.3:
            body.update(echo=True, logprobs=1)
        st, hd, js = self.post("/v1/completions", body)
        if self.expect_ok("completion", st, hd, js) and len(js["choices"]) != 2:
            raise Failure(f"{len(js['choices'])} choices for 2 prompts")

    def op_json(self, rng, state):
        schema = {"type": "object", "properties": {"n": {"type": "integer"},
                                                   "ok": {"type": "boolean"}},
                  "required": ["n", "ok"], "additionalProperties": False}
        body = {"messages": [{"role": "user", "content": "JSON"}], "max_tokens": 60,
                "temperature": 1.0, "seed": rng.randint(0, 1 << 30),
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "x", "schema": schema}}}
        st, hd, js = self.post("/v1/chat/completions", body)
        if not self.expect_ok("json", st, hd, js):
            return
        ch = js["choices"][0]
        if ch["finish_reason"] == "stop":
            v = json.loads(ch["message"]["content"])
            if set(v) != {"n", "ok"} or not isinstance(v["ok"], bool):
                raise Failure(f"JSON off its schema: {v}")

    def op_tools(self, rng, state):
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"days": {"type": "integer"},
                                             "unit": {"enum": ["c", "f"]}},
            "required": ["days", "unit"]}}}]
        body = {"messages": [{"role": "user", "content": "weather?"}], "tools": tools,
                "tool_choice": "required", "max_tokens": 80, "temperature": 1.0,
                "seed": rng.randint(0, 1 << 30)}
        st, hd, js = self.post("/v1/chat/completions", body)
        if not self.expect_ok("tools", st, hd, js):
            return
        ch = js["choices"][0]
        if ch["finish_reason"] == "tool_calls":
            for c in ch["message"]["tool_calls"]:
                a = json.loads(c["function"]["arguments"])
                if c["function"]["name"] != "get_weather" or a.get("unit") not in ("c", "f"):
                    raise Failure(f"a call off its tools: {c}")

    def op_embeddings(self, rng, state):
        if not self.embeddings:
            return
        st, hd, js = self.post("/v1/embeddings", {"input": [self.words(rng, 3), "x"]})
        if not self.expect_ok("embeddings", st, hd, js):
            return
        for d in js["data"]:
            norm = math.sqrt(sum(x * x for x in d["embedding"]))
            if abs(norm - 1) > 1e-3:
                raise Failure(f"an embedding of norm {norm}")

    def op_responses(self, rng, state):
        body = {"input": self.words(rng, 4), "max_output_tokens": rng.randint(1, 10),
                "temperature": 0}
        prev = state.get("response")
        if prev and rng.random() < 0.6:
            body["previous_response_id"] = prev
        if rng.random() < 0.3:  # streamed: the last event says how the response ended
            st, events = self.stream("/v1/responses", dict(body, stream=True), events_only=True)
            last = {"response.completed", "response.incomplete"}
            if st == 200 and not any(e.get("type") in last for e in events):
                raise Failure("a Responses stream without its last event")
            return
        st, hd, js = self.post("/v1/responses", body)
        if st == 404 and prev:  # the stored response was pushed out by newer ones
            state.pop("response", None)
            return
        if self.expect_ok("responses", st, hd, js):
            state["response"] = js["id"]

    def op_messages(self, rng, state):
        body = {"max_tokens": rng.randint(1, 10),
                "messages": [{"role": "user", "content": self.words(rng, 4)}]}
        if rng.random() < 0.5:
            body["stream"] = True
            st, events = self.stream("/v1/messages", body)
            if st == 200 and not any(e.get("type") == "message_stop" for e in events):
                raise Failure("a Messages stream without message_stop")
            return
        st, hd, js = self.post("/v1/messages", body)
        if self.expect_ok("messages", st, hd, js) and js["type"] != "message":
            raise Failure(f"not a message: {js}")

    def op_infill(self, rng, state):
        """llama-server's /infill with the project's other files; a model without fill in the
        middle answers 400 unsupported_feature."""
        body = {"input_prefix": "def f(x):\n    ", "input_suffix": "\n\nprint(f(2))\n",
                "input_extra": [{"filename": "util.py", "text": self.words(rng, 5)}],
                "n_predict": rng.randint(1, 12), "temperature": 0}
        st, hd, js = self.post("/infill", body)
        if st == 400 and js["error"]["code"] == "unsupported_feature":
            return
        if self.expect_ok("infill", st, hd, js) and not isinstance(js.get("content"), str):
            raise Failure(f"an /infill answer without content: {js}")

    def op_prediction(self, rng, state):
        """Predicted Outputs: the answer is the model's, whatever is guessed from it."""
        text = self.words(rng, 10)
        body = {"messages": [{"role": "user", "content": "Repeat: " + text}],
                "prediction": {"type": "content", "content": text}, "temperature": 0,
                "max_tokens": rng.randint(2, 16)}
        st, hd, js = self.post("/v1/chat/completions", body)
        if self.expect_ok("prediction", st, hd, js):
            d = js["usage"].get("completion_tokens_details", {})
            if d.get("accepted_prediction_tokens", 0) > js["usage"]["completion_tokens"]:
                raise Failure(f"more guesses accepted than tokens: {js['usage']}")

    def op_constrained(self, rng, state):
        """A regular expression or a GBNF grammar over the answer, n choices, best_of."""
        if rng.random() < 0.5:
            body = {"messages": [{"role": "user", "content": "a date"}], "max_tokens": 20,
                    "guided_regex": r"[0-9]{4}-[0-9]{2}-[0-9]{2}", "temperature": 1.0,
                    "seed": rng.randint(0, 1 << 30), "n": 2}
            st, hd, js = self.post("/v1/chat/completions", body)
            if not self.expect_ok("constrained", st, hd, js):
                return
            for ch in js["choices"]:
                c = ch["message"]["content"]
                if ch["finish_reason"] == "stop" and (len(c) != 10 or c[4] != "-"):
                    raise Failure(f"an answer off its regex: {c!r}")
            return
        body = {"prompt": self.words(rng, 3), "max_tokens": 8, "n": 2, "best_of": 3,
                "temperature": 1.0, "seed": rng.randint(0, 1 << 30),
                "grammar": 'root ::= ("yes" | "no") " " [a-z]{1,4}'}
        st, hd, js = self.post("/v1/completions", body)
        if self.expect_ok("constrained", st, hd, js) and len(js["choices"]) != 2:
            raise Failure(f"{len(js['choices'])} choices of best_of 3, n 2")

    def op_image(self, rng, state):
        """Pictures in a chat (a model with a vision tower): one or two of random sizes, now
        and then the same twice or a broken one (a 400 naming the part)."""
        if not self.vision:
            return
        def picture():  # one colour and a white diagonal
            rgb = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
            return png(rng.randint(16, 80), rng.randint(16, 80),
                       lambda x, y: (255, 255, 255) if x == y else rgb)
        imgs = [picture() for _ in range(rng.randint(1, 2))]
        if rng.random() < 0.2:
            imgs.append(imgs[0])
        broken = rng.random() < 0.15
        if broken:
            imgs[-1] = imgs[-1][:len(imgs[-1]) // 2]
        parts = [{"type": "image_url", "image_url": {
            "url": "data:image/png;base64," + base64.b64encode(b).decode()}} for b in imgs]
        body = {"messages": [{"role": "user", "content": parts + [
            {"type": "text", "text": self.words(rng, 4)}]}], "max_tokens": rng.randint(1, 8),
            "temperature": 0}
        st, hd, js = self.post("/v1/chat/completions", body)
        if broken:
            self.expect_error(st, js, (400,))
        else:
            self.expect_ok("image", st, hd, js)

    def op_tokenize(self, rng, state):
        text = self.words(rng, 6)
        st, hd, js = self.post("/tokenize", {"content": text})
        if not self.expect_ok("tokenize", st, hd, js):
            return
        st, hd, back = self.post("/detokenize", {"tokens": js["tokens"]})
        if self.expect_ok("tokenize", st, hd, back) and back["content"].strip() != text:
            raise Failure(f"detokenize(tokenize({text!r})) = {back['content']!r}")

    def op_reads(self, rng, state):
        for path in ("/health", "/metrics", "/v1/models", "/props"):
            st, _, _ = self.call("GET", path)
            if st != 200:
                raise Failure(f"GET {path}: {st}")

    def op_bad(self, rng, state):
        kind = rng.randrange(7)
        if kind == 0:  # malformed JSON
            st, _, data = self.call("POST", "/v1/chat/completions", raw=b'{"messages": [')
            self.expect_error(st, json.loads(data), (400,))
        elif kind == 1:  # a field of the wrong type
            st, _, js = self.post("/v1/chat/completions", {"messages": "hi", "max_tokens": "x"})
            self.expect_error(st, js, (400,))
        elif kind == 2:  # a prompt longer than the context
            st, _, js = self.post("/v1/completions", {"prompt": [5] * (self.ctx + 8),
                                                      "max_tokens": 4})
            self.expect_error(st, js, (400,))
        elif kind == 3:  # a body over the limit
            big = b'{"prompt": "' + b"a" * (8 << 20) + b'"}'
            try:
                st, _, data = self.call("POST", "/v1/completions", raw=big)
                self.expect_error(st, json.loads(data), (413,))
            except (ConnectionError, BrokenPipeError):
                pass  # refused while still sending: the connection is closed on it
        elif kind == 4:  # a body that never arrives whole
            s = socket.create_connection((self.host, self.port), timeout=10)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n"
                      b'{"prompt": "tru')
            s.close()
        elif kind == 5:  # garbage
            s = socket.create_connection((self.host, self.port), timeout=10)
            s.sendall(bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))) + b"\r\n\r\n")
            try:
                s.recv(4096)
            except OSError:
                pass
            s.close()
        else:  # an unknown route
            st, _, data = self.call("GET", "/v1/nothing-here")
            self.expect_error(st, json.loads(data), (404,))

    OPS = [("chat", op_chat, 6), ("stream", op_stream, 4), ("leave_stream", None, 2),
           ("leave", op_leave, 1), ("conversation", op_conversation, 3),
           ("completion", op_completion, 2), ("json", op_json, 1), ("tools", op_tools, 1),
           ("embeddings", op_embeddings, 1), ("responses", op_responses, 1),
           ("messages", op_messages, 1), ("tokenize", op_tokenize, 1), ("reads", op_reads, 1),
           ("infill", op_infill, 1), ("prediction", op_prediction, 1),
           ("constrained", op_constrained, 1), ("image", op_image, 1), ("bad", op_bad, 3)]

    # ---- running it ----------------------------------------------------------------------

    def client(self, k, deadline):
        rng = random.Random(self.seed * 1000 + k)
        state = {}
        names = [o[0] for o in self.OPS]
        weights = [o[2] for o in self.OPS]
        while time.time() < deadline:
            name = rng.choices(names, weights)[0]
            fn = dict((o[0], o[1]) for o in self.OPS)[name]
            try:
                if name == "leave_stream":
                    self.op_stream(rng, state, leave=True)
                else:
                    fn(self, rng, state)
                with self.lock:
                    self.counts.setdefault(name, [0, 0])[0] += 1
            except Exception as e:  # noqa: BLE001 - every kind of failure is a finding
                with self.lock:
                    self.failures.append((name, f"{type(e).__name__}: {e}"))

    def sample_rss(self, t0, stop):
        while not stop.is_set():
            try:
                with open(f"/proc/{self.pid}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            self.rss.append((time.time() - t0, int(line.split()[1]) / 1024))
            except OSError:
                return
            stop.wait(1.0)

    def reference(self):
        st, hd, js = self.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "The same question, every time."}],
            "max_tokens": 16, "temperature": 0})
        if st != 200:
            raise Failure(f"the reference request: {st} {js}")
        return js["choices"][0]["message"]["content"]

    def gauges(self):
        _, _, data = self.call("GET", "/metrics")
        out = {}
        for line in data.decode().splitlines():
            if line.startswith(("tessera_running ", "tessera_queue_depth ")):
                k, v = line.split()
                out[k] = float(v)
        return out

    def run(self):
        _, _, data = self.call("GET", "/v1/models")
        m = json.loads(data)["data"][0]
        self.model, self.ctx = m["id"], m["context_length"]
        _, _, data = self.call("GET", "/props")
        self.vision = bool(json.loads(data).get("modalities", {}).get("vision"))
        before = self.reference()
        t0 = time.time()
        stop = threading.Event()
        sampler = None
        if self.pid:
            sampler = threading.Thread(target=self.sample_rss, args=(t0, stop), daemon=True)
            sampler.start()
        threads = [threading.Thread(target=self.client, args=(k, t0 + self.seconds))
                   for k in range(self.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # the server settles: departed clients' jobs end, nothing stays running or queued
        deadline = time.time() + 30
        g = self.gauges()
        while time.time() < deadline and any(g.values()):
            time.sleep(0.1)
            g = self.gauges()
        if any(g.values()):
            self.failures.append(("end", f"the server is not idle after the soak: {g}"))
        after = self.reference()
        if after != before:
            self.failures.append(("end", f"the reference answer changed: {before!r} -> {after!r}"))
        stop.set()
        if sampler:
            sampler.join()
        return self.report(time.time() - t0)

    def report(self, elapsed):
        growth = None
        if len(self.rss) >= 8:  # the median of the last quarter against that of the second
            q = len(self.rss) // 4
            med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
            growth = med([r for _, r in self.rss[-q:]]) - med([r for _, r in self.rss[q:2 * q]])
        return {"seconds": round(elapsed, 1), "clients": self.clients,
                "ops": {k: {"done": v[0], "refused_503": v[1]} for k, v in
                        sorted(self.counts.items())},
                "failures": self.failures[:50], "n_failures": len(self.failures),
                "rss_mb": [round(r, 1) for _, r in self.rss[::max(1, len(self.rss) // 20)]],
                "rss_growth_mb": None if growth is None else round(growth, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pid", type=int, help="the server's process id, to sample its memory")
    ap.add_argument("--no-embeddings", action="store_true",
                    help="leave out /v1/embeddings (a server that answers none)")
    a = ap.parse_args()
    r = Soak(a.url, a.seconds, a.clients, a.seed, a.pid, not a.no_embeddings).run()
    print(json.dumps(r, indent=1, ensure_ascii=False))
    raise SystemExit(1 if r["n_failures"] else 0)


if __name__ == "__main__":
    main()
