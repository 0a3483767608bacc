"""Memory under many large bodies at once: a body's JSON tree takes up to ~75 times its bytes,
so the bodies being parsed and prepared together are bounded (4 times --max-body-kb); the
others wait their turn (counted in tessera_prep_waits_total), and each answer is the one it
would get alone."""
import http.client
import os
import threading

from server_util import Server


def peak_rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def test_large_bodies_at_once_are_parsed_a_few_at_a_time():
    # 2M token ids: 4 MB of JSON, ~90 MB as a tree; past the context, so each answer is a 400
    body = ("{\"prompt\": [" + ",".join(["1"] * 2_000_000) + "], \"max_tokens\": 1}").encode()
    with Server("--max-pending", "4") as s:
        before = peak_rss_mb(s.proc.pid)
        answers = []

        def send():
            c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=300)
            c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            answers.append((r.status, r.read()))
            c.close()

        threads = [threading.Thread(target=send) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(answers) == 16
        for status, data in answers:
            assert status == 400 and b"context_length_exceeded" in data, data[:200]
        assert s.metrics()["tessera_prep_waits_total"] > 0
        # 16 trees at once took ~1.4 GB; four at a time ~0.4 GB (a sanitizer's allocator keeps
        # freed memory aside, so its figure says nothing)
        if not os.environ.get("TS_SERVER_BIN"):
            grown = peak_rss_mb(s.proc.pid) - before
            assert grown < 800, f"peak RSS grew {grown:.0f} MB"
