"""Starting the real `tessera serve` on loopback for the server tests.

The model is a tiny random Qwen3.5 (`tessera synth --preset tiny`) with the small real BPE
tokenizer of the fixtures: gibberish output, but every serving behaviour is testable.
TS_SERVER_BIN points the tests at another build of the binary (e.g. ASan + UBSan); otherwise
TS_BIN, otherwise build/tessera."""

import http.client
import json
import os
import re
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)


def binary():
    for var in ("TS_SERVER_BIN", "TS_BIN"):
        if os.environ.get(var):
            return os.environ[var]
    return os.path.join(REPO, "build", "tessera")


def fixtures():
    return os.environ.get("TS_FIXTURES") or os.path.join(REPO, "tests", "fixtures")


_model_lock = threading.Lock()


def tiny_model():
    """A tiny random model directory with a real tokenizer (built once per build dir)."""
    base = os.environ.get("TS_BUILD") or tempfile.gettempdir()
    path = os.path.abspath(os.path.join(base, "test-cache", "serve-tiny"))
    with _model_lock:
        if not os.path.exists(os.path.join(path, "tokenizer.json")):
            tmp = path + f".tmp{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            subprocess.run([binary(), "synth", "--preset", "tiny", "-o", tmp], check=True,
                           capture_output=True)
            shutil.copy(os.path.join(fixtures(), "tokenizer", "small", "tokenizer.json"), tmp)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            try:
                os.rename(tmp, path)
            except OSError:  # another test process won the race
                shutil.rmtree(tmp, ignore_errors=True)
    return path


class Server:
    """`tessera serve` on 127.0.0.1 and a free port (--port 0; the port is read from stderr)."""

    def __init__(self, *args, model=None, wait_ready=True, env=None, files=None):
        """files: (soft, hard) open-file limit for the server process (hard capped at ours)."""
        self.model = model or tiny_model()
        cmd = [binary(), "serve", "-m", self.model, "--port", "0", "--threads", "1", *args]
        self.log = tempfile.TemporaryFile()
        e = dict(os.environ)
        e.pop("TESSERA_API_KEY", None)
        e.update(env or {})
        limit = None
        if files:
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            if hard != resource.RLIM_INFINITY:
                files = (min(files[0], hard), min(files[1], hard))
            limit = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, files)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.PIPE, env=e,
                                     preexec_fn=limit)
        self.port = None
        self._lines = []
        deadline = time.time() + 30
        while self.port is None:
            line = self.proc.stderr.readline().decode(errors="replace")
            if not line:
                raise RuntimeError("server exited early:\n" + "".join(self._lines))
            self._lines.append(line)
            m = re.search(r"on http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            if time.time() > deadline:
                raise RuntimeError("server did not start:\n" + "".join(self._lines))
        threading.Thread(target=self._drain, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.port}"
        if wait_ready:
            self.wait_ready()

    def _drain(self):
        for line in self.proc.stderr:
            self._lines.append(line.decode(errors="replace"))

    def stderr(self):
        return "".join(self._lines)

    def wait_ready(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                status, _, _ = self.request("GET", "/health")
                if status == 200:
                    return
            except OSError:
                if self.proc.poll() is not None:  # it gave up loading: no need to wait on
                    break
            time.sleep(0.02)
        time.sleep(0.1)  # its last words
        raise RuntimeError("server not ready:\n" + self.stderr())

    def request(self, method, path, body=None, headers=None, timeout=60):
        """Raw HTTP: returns (status, headers dict (lower-case), body bytes)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Content-Type": "application/json"} if body is not None else {}
        h.update(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        hd = {k.lower(): v for k, v in r.getheaders()}
        c.close()
        return r.status, hd, data

    def post(self, path, body, **kw):
        status, hd, data = self.request("POST", path, body, **kw)
        return status, hd, json.loads(data) if data else None

    def post_ok(self, path, body):
        """POSTs body and returns the answer's JSON, asserting a 200."""
        status, _, r = self.post(path, body)
        assert status == 200, r
        return r

    def metrics(self):
        _, _, data = self.request("GET", "/metrics")
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def settle(self):
        """Makes the worker decide any idle work still pending from the last chat answer (it
        waits a moment for a next request before preparing the next turn): a 1-token raw
        completion is admitted, which settles it, and its own idle work is not a next turn.
        Afterwards the next-turn counters only move for chats sent from now on."""
        status, _, _ = self.request("POST", "/v1/completions",
                                    {"prompt": "x", "max_tokens": 1, "temperature": 0})
        assert status == 200

    def next_turns(self):
        """Chat answers whose next-turn preparation ended (kept or given up)."""
        m = self.metrics()
        return m["tessera_next_turn_ready_total"] + m["tessera_next_turn_abandoned_total"]

    def wait_next_turn(self, before, timeout=10):
        """Waits until a next turn more than `before` has been prepared: a client reading the
        answer gives the idle worker this time, and a test that needs the state waits for it."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.next_turns() > before:
                return
            time.sleep(0.01)
        raise AssertionError("the next turn was never prepared:\n" + self.stderr()[-2000:])

    def client(self, api_key="none"):
        import openai
        return openai.OpenAI(base_url=self.base + "/v1", api_key=api_key, max_retries=0)

    def stop(self, sig=signal.SIGTERM, timeout=20):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("server did not exit after the signal:\n" + self.stderr())
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        rc = self.stop()
        # a sanitizer report or a crash must fail the test that caused it
        if exc[0] is None:
            assert rc == 0, f"server exited {rc}:\n{self.stderr()[-4000:]}"


def raw(port, data, timeout=10):
    """Sends raw bytes, returns what came back (maybe nothing)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server answered and closed before all of it was sent: read its answer
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            out += chunk
        return out
    finally:
        s.close()


def chat(content, **kw):
    body = {"messages": [{"role": "user", "content": content}], "temperature": 0}
    body.update(kw)
    return body


def at_once(fn, n, timeout=120):
    """Calls fn(0) .. fn(n - 1), each from its own thread, every thread started before any is
    joined (requests in flight together)."""
    threads = [threading.Thread(target=fn, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)


def hold_conversations(srv, n, max_tokens=6):
    """n conversations' first turns, each answered and its next turn prepared, each then
    asking a follow-up: returns the conversations (messages) and their first prompts' token
    counts."""
    convs, first = [], []
    for k in range(n):
        msgs = [{"role": "user", "content": f"Conversation {k}: tell me about the number {k}."}]
        before = srv.next_turns()
        status, _, r = srv.post("/v1/chat/completions", {"messages": msgs, "temperature": 0,
                                                         "max_tokens": max_tokens})
        assert status == 200, r
        first.append(r["usage"]["prompt_tokens"])
        msgs.append({"role": "assistant", "content": r["choices"][0]["message"]["content"]})
        msgs.append({"role": "user", "content": "And then?"})
        srv.wait_next_turn(before)
        convs.append(msgs)
    return convs, first


def png_file(width, height, idat):
    """An 8-bit RGB PNG around its compressed rows (each a filter byte 0, then its pixels)."""
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data +
                struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2,
                                                               0, 0, 0)) +
            chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def png(width, height, pixel):
    """A PNG of 8-bit RGB pixels, pixel(x, y) -> (r, g, b): written here, no image library."""
    rows = b"".join(b"\0" + bytes(v for x in range(width) for v in pixel(x, y))
                    for y in range(height))
    return png_file(width, height, zlib.compress(rows))
