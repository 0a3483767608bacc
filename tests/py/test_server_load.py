"""Admission, cancellation and shutdown under load: the cap is exact, refusals are immediate,
a client that leaves stops its job (running: within a decode step; queued: never prefilled),
and SIGTERM drains or cancels within the deadline and exits 0."""
import http.client
import json
import signal
import socket
import threading
import time

from server_util import Server, at_once, chat

STEP_MS = 40


def open_stream(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/v1/chat/completions", json.dumps(dict(body, stream=True)),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    return c, r


def read_events(r, n):
    events = []
    while len(events) < n:
        line = r.fp.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            events.append(line[6:].strip())
            if events[-1] == b"[DONE]":
                break
    return events


def wait_for(pred, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def test_admission_cap_exact():
    with Server("--max-pending", "3", "--debug-step-delay-ms", str(STEP_MS)) as s:
        n = 10
        barrier = threading.Barrier(n)
        results = [None] * n

        def go(i):
            barrier.wait()
            t0 = time.perf_counter()
            st, hd, body = s.post("/v1/chat/completions", chat("hi", max_tokens=15))
            results[i] = (st, hd, body, time.perf_counter() - t0)

        at_once(go, n, 60)
        ok = [r for r in results if r[0] == 200]
        busy = [r for r in results if r[0] == 503]
        assert len(ok) == 3 and len(busy) == 7, [r[0] for r in results]
        for st, hd, body, dt in busy:
            assert hd["retry-after"] and body["error"]["code"] == "server_busy"
            assert dt < 0.5  # refused at once, not queued
        for st, hd, body, dt in ok:
            assert body["usage"]["completion_tokens"] == 15
        m = s.metrics()
        assert m["tessera_rejected_total"] == 7
        assert m["tessera_running"] == 0 and m["tessera_queue_depth"] == 0


def test_streaming_disconnect_stops_job_and_frees_slot():
    with Server("--max-pending", "1", "--debug-step-delay-ms", str(STEP_MS)) as s:
        c, r = open_stream(s.port, chat("tell me", max_tokens=2000))
        assert len(read_events(r, 4)) == 4
        c.sock.shutdown(socket.SHUT_RDWR)
        c.close()
        t0 = time.time()
        assert wait_for(lambda: s.metrics()["tessera_cancelled_total"] == 1, 5)
        dt = time.time() - t0
        m = s.metrics()
        assert m["tessera_running"] == 0
        # stopped within about a decode step (plus the time to notice the socket closed)
        assert dt < 1.0, dt
        generated = m["tessera_completion_tokens_total"]
        assert generated < 60, generated
        time.sleep(3 * STEP_MS / 1000)
        assert s.metrics()["tessera_completion_tokens_total"] == generated
        # the slot is free again: a new request is admitted (cap 1) and completes
        st, _, body = s.post("/v1/chat/completions", chat("again", max_tokens=3))
        assert st == 200, body


def test_non_streaming_disconnect_cancels():
    with Server("--debug-step-delay-ms", str(STEP_MS)) as s:
        sock = socket.create_connection(("127.0.0.1", s.port))
        body = json.dumps(chat("x", max_tokens=2000)).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        assert wait_for(lambda: s.metrics()["tessera_running"] == 1, 5)
        sock.close()
        assert wait_for(lambda: s.metrics()["tessera_cancelled_total"] == 1, 5)
        assert s.metrics()["tessera_completion_tokens_total"] < 60


def test_queued_job_of_departed_client_is_never_prefilled():
    # one lane, so that the second request queues behind the first
    with Server("--debug-step-delay-ms", str(STEP_MS), "--parallel", "1") as s:
        c, r = open_stream(s.port, chat("first", max_tokens=25))
        read_events(r, 2)
        before = s.metrics()["tessera_prefill_tokens_total"]
        sock = socket.create_connection(("127.0.0.1", s.port))
        body = json.dumps(chat("second " * 50, max_tokens=5)).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        assert wait_for(lambda: s.metrics()["tessera_queue_depth"] == 1, 5)
        sock.close()
        events = read_events(r, 1000)
        assert events[-1] == b"[DONE]"
        assert wait_for(lambda: s.metrics()["tessera_cancelled_queued_total"] == 1, 5)
        m = s.metrics()
        assert m["tessera_prefill_tokens_total"] == before
        assert m["tessera_queue_depth"] == 0 and m["tessera_running"] == 0
        c.close()


def test_sigterm_drains_running_stream():
    s = Server("--debug-step-delay-ms", str(STEP_MS), "--drain-ms", "10000")
    c, r = open_stream(s.port, chat("x", max_tokens=20))
    read_events(r, 2)
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    events = read_events(r, 1000)
    assert events[-1] == b"[DONE]"
    final = json.loads(events[-2])
    assert final["choices"][0]["finish_reason"] == "length"
    assert s.proc.wait(15) == 0
    assert time.time() - t0 < 10


def test_sigterm_cancels_after_deadline():
    s = Server("--debug-step-delay-ms", str(STEP_MS), "--drain-ms", "300")
    c, r = open_stream(s.port, chat("x", max_tokens=3000))
    read_events(r, 2)
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    events = read_events(r, 100000)
    assert events[-1] == b"[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "server_shutting_down"
    assert s.proc.wait(10) == 0
    assert time.time() - t0 < 5
    # new connections are refused once it has gone
    try:
        socket.create_connection(("127.0.0.1", s.port), timeout=1).close()
        refused = False
    except OSError:
        refused = True
    assert refused


def test_sigint_idle_exits_zero():
    s = Server()
    s.proc.send_signal(signal.SIGINT)
    assert s.proc.wait(10) == 0
