"""Memory under many large bodies at once: a body's JSON tree takes up to ~75 times its bytes,
so the bodies being parsed and prepared together are bounded (4 times --max-body-kb); the
others wait their turn (counted in tessera_prep_waits_total), and each answer is the one it
would get alone. The bodies held as received are bounded too (64 times --max-body-kb, by the
bytes that arrived, not those declared): one that does not fit is refused."""
import http.client
import os
import socket
import threading
import time

from server_util import Server


def status_mb(pid, key):
    """A memory figure of /proc/PID/status (VmHWM: the peak, VmRSS: now) in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def send_at_once(port, path, body, n, meanwhile=None):
    """POSTs body n times at once; meanwhile() runs while they are out. Returns [(status,
    data)]."""
    answers = []

    def send():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        c.request("POST", path, body, {"Content-Type": "application/json"})
        r = c.getresponse()
        answers.append((r.status, r.read()))
        c.close()

    threads = [threading.Thread(target=send) for _ in range(n)]
    for t in threads:
        t.start()
    if meanwhile:
        meanwhile()
    for t in threads:
        t.join()
    return answers


def test_large_bodies_at_once_are_parsed_a_few_at_a_time():
    # 2M token ids: 4 MB of JSON, ~90 MB as a tree; past the context, so each answer is a 400
    body = ("{\"prompt\": [" + ",".join(["1"] * 2_000_000) + "], \"max_tokens\": 1}").encode()
    with Server("--max-pending", "4") as s:
        before = status_mb(s.proc.pid, "VmHWM")
        answers = send_at_once(s.port, "/v1/completions", body, 16)
        assert len(answers) == 16
        for status, data in answers:
            assert status == 400 and b"context_length_exceeded" in data, data[:200]
        assert s.metrics()["tessera_prep_waits_total"] > 0
        # 16 trees at once took ~1.4 GB; four at a time ~0.4 GB (a sanitizer's allocator keeps
        # freed memory aside, so its figure says nothing)
        if not os.environ.get("TS_SERVER_BIN"):
            grown = status_mb(s.proc.pid, "VmHWM") - before
            assert grown < 800, f"peak RSS grew {grown:.0f} MB"


def start_body(port, length, sent):
    """A POST whose headers declare length bytes of body, and sent of them sent."""
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % length + b"a" * sent)
    return c


def test_bodies_held_as_received_are_bounded():
    # --max-body-kb 1024: the bodies held as received take at most 64 MiB between them
    mib = 1 << 20
    with Server("--max-body-kb", "1024") as s:
        # declared, not sent: they hold nothing
        declared = [start_body(s.port, mib, 0) for _ in range(70)]
        time.sleep(1)
        status, _, _ = s.request("POST", "/tokenize", {"content": "x" * (mib - 100)})
        assert status == 200
        # sent but for their last bytes: 64 of them fill the budget
        held = [start_body(s.port, mib, mib - 10) for _ in range(64)]
        time.sleep(1)
        late = start_body(s.port, mib, mib)  # a whole body that does not fit: read, dropped
        late.settimeout(10)
        answer = late.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503") and b"server_busy" in answer, answer[:200]
        late.close()
        # a chunked body likewise
        c = socket.create_connection(("127.0.0.1", s.port))
        c.settimeout(10)
        c.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        piece = b"a" * 65536
        for _ in range(4):
            c.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        c.sendall(b"0\r\n\r\n")
        assert c.recv(4096).startswith(b"HTTP/1.1 503")
        c.close()
        # one leaves: its bytes are given back, and a whole body fits again
        held.pop().close()
        time.sleep(1)
        status, _, _ = s.request("POST", "/tokenize", {"content": "x" * (mib - 100)})
        assert status == 200
        for c in held + declared:
            c.close()
        assert s.metrics()["tessera_rejected_total"] == 2


def test_a_running_chat_keeps_its_messages_not_its_body():
    # each body carries ~1.8 MB of fields the server ignores (~135 MB as a JSON tree); a chat's
    # job keeps its messages for the next turn, not the tree they came in
    junk = "[" + ",".join(["{}"] * 600_000) + "]"
    body = ('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 30, '
            '"ignore_eos": true, "metadata": ' + junk + "}").encode()
    with Server("--max-pending", "8", "--parallel", "8", "--debug-step-delay-ms", "200") as s:
        before = status_mb(s.proc.pid, "VmRSS")
        grown = []

        def when_all_run():
            deadline = time.time() + 60
            while s.metrics().get("tessera_running", 0) < 8 and time.time() < deadline:
                time.sleep(0.05)
            grown.append(status_mb(s.proc.pid, "VmRSS") - before)

        answers = send_at_once(s.port, "/v1/chat/completions", body, 8, when_all_run)
        running = grown[0]
        assert [a[0] for a in answers] == [200] * 8, answers[0][1][:200]
        if not os.environ.get("TS_SERVER_BIN"):
            # eight trees kept would be ~1.1 GB
            assert running < 400, f"RSS grew {running:.0f} MB with 8 chats running"


def test_memory_is_taken_as_it_is_used():
    """A server's state buffers - each lane's for the whole context, the snapshot pool of all
    of --cache-mb - take memory as they are used, not at start: with --cache-mb 512 and a
    context of 32768 the idle server holds far less than either; a conversation takes its
    tokens' share."""
    if os.environ.get("TS_SERVER_BIN"):  # a sanitizer's allocator and shadow memory
        return
    with Server("--cache-mb", "512", "--ctx", "32768") as s:
        idle = status_mb(s.proc.pid, "VmRSS")
        assert idle < 100, idle
        r = s.post_ok("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                               "max_tokens": 8})
        assert r["usage"]["completion_tokens"] > 0
        assert status_mb(s.proc.pid, "VmRSS") < 120
