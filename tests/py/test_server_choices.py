"""Several answers in one request: `n` choices (chat and completions) and several prompts in one
completion request. Choice c of a prompt is sampled as a request of its own with seed + c;
the choices' prompt is prefilled once; they are admitted all together or refused all
together; a client that leaves cancels every one."""
import json
import re
import socket
import threading
import time

from server_util import Server, chat
from test_server_load import STEP_MS, open_stream, read_events, wait_for

MSG = "Tell me a story about a cat."


def test_chat_n_choices_are_the_seeded_single_answers():
    with Server() as srv:
        body = chat(MSG, temperature=1.0, seed=7, max_tokens=12, return_token_ids=True)
        r = srv.post_ok("/v1/chat/completions", dict(body, n=3))
        assert [c["index"] for c in r["choices"]] == [0, 1, 2]
        alone = [srv.post_ok("/v1/chat/completions", dict(body, seed=7 + c)) for c in range(3)]
        for c in range(3):
            assert r["choices"][c]["token_ids"] == alone[c]["choices"][0]["token_ids"]
            assert r["choices"][c]["message"] == alone[c]["choices"][0]["message"]
        # the seeds differ, so the answers do (a random model's flat distribution)
        assert len({tuple(c["token_ids"]) for c in r["choices"]}) == 3
        # usage: the prompt once, every answer's tokens
        assert r["usage"]["prompt_tokens"] == alone[0]["usage"]["prompt_tokens"]
        assert r["usage"]["completion_tokens"] == sum(
            a["usage"]["completion_tokens"] for a in alone)
        # greedy: n equal answers
        g = srv.post_ok("/v1/chat/completions", chat(MSG, max_tokens=10, n=2))
        assert g["choices"][0]["message"] == g["choices"][1]["message"]


def test_choices_prefill_their_prompt_once():
    with Server() as srv:
        body = {"prompt": "The quick brown fox jumps over the lazy dog. " * 20, "max_tokens": 4,
                "temperature": 1.0, "seed": 1}
        m0 = srv.metrics()["tessera_prefill_tokens_total"]
        r = srv.post_ok("/v1/completions", dict(body, n=4))
        n = r["usage"]["prompt_tokens"]
        assert len(r["choices"]) == 4
        # the first choice prefills the prompt; the others start from its snapshot
        assert srv.metrics()["tessera_prefill_tokens_total"] - m0 == n


def test_several_prompts_times_n():
    with Server() as srv:
        prompts = ["Once upon a time", [5, 6, 7, 8, 9]]
        body = {"prompt": prompts, "n": 2, "max_tokens": 6, "temperature": 0.9, "seed": 3,
                "return_token_ids": True}
        r = srv.post_ok("/v1/completions", body)
        assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
        usage_prompt = 0
        for p, prompt in enumerate(prompts):
            for c in range(2):
                a = srv.post_ok("/v1/completions", dict(body, prompt=prompt, n=1, seed=3 + c))
                assert r["choices"][2 * p + c]["token_ids"] == a["choices"][0]["token_ids"]
                assert r["choices"][2 * p + c]["text"] == a["choices"][0]["text"]
            usage_prompt += a["usage"]["prompt_tokens"]
        assert r["usage"]["prompt_tokens"] == usage_prompt
        # a bad prompt among several names its place
        status, _, e = srv.post("/v1/completions", {"prompt": ["a", [1, 99999999]]})
        assert status == 400 and e["error"]["message"].startswith("prompt 1: "), e


def test_stream_of_choices_matches_the_whole_answer():
    with Server() as srv:
        body = chat(MSG, temperature=1.0, seed=11, max_tokens=16, n=3)
        whole = srv.post_ok("/v1/chat/completions", body)
        status, _, data = srv.request("POST", "/v1/chat/completions",
                                      dict(body, stream=True,
                                           stream_options={"include_usage": True}))
        assert status == 200
        text, roles, finishes, usage, done = {}, [], [], [], 0
        for line in data.decode().splitlines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done += 1
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage.append(ev["usage"])
            for ch in ev["choices"]:
                i = ch["index"]
                if ch["delta"].get("role"):
                    roles.append(i)
                text[i] = text.get(i, "") + (ch["delta"].get("content") or "")
                if ch["finish_reason"]:
                    finishes.append(i)
        assert sorted(roles) == [0, 1, 2] and sorted(finishes) == [0, 1, 2] and done == 1
        for c in whole["choices"]:
            assert text[c["index"]] == c["message"]["content"]
        assert len(usage) == 1
        for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
            assert usage[0][k] == whole["usage"][k]


def test_choices_are_admitted_together_or_refused_together():
    with Server("--max-pending", "4", "--debug-step-delay-ms", str(STEP_MS)) as srv:
        c, r = open_stream(srv.port, chat("tell me", max_tokens=2000, n=2))
        assert read_events(r, 3)
        # two of four admitted: three more do not fit, and none of them runs
        t0 = time.perf_counter()
        status, hd, e = srv.post("/v1/chat/completions", chat("x", max_tokens=3, n=3))
        assert status == 503 and e["error"]["code"] == "server_busy", e
        assert time.perf_counter() - t0 < 0.5
        m = srv.metrics()
        assert m["tessera_running"] + m["tessera_queue_depth"] == 2
        assert m["tessera_rejected_total"] == 1
        # two more do
        status, _, ok = srv.post("/v1/chat/completions", chat("x", max_tokens=3, n=2))
        assert status == 200 and len(ok["choices"]) == 2, ok
        c.close()


def test_a_client_that_leaves_cancels_every_choice():
    with Server("--debug-step-delay-ms", str(STEP_MS)) as srv:
        c, r = open_stream(srv.port, chat("tell me", max_tokens=2000, n=3))
        assert len(read_events(r, 6)) == 6
        c.sock.shutdown(socket.SHUT_RDWR)
        c.close()
        assert wait_for(lambda: srv.metrics()["tessera_cancelled_total"] == 3, 5)
        assert srv.metrics()["tessera_running"] == 0
        # non-streaming, too
        sock = socket.create_connection(("127.0.0.1", srv.port))
        body = json.dumps(chat("x", max_tokens=2000, n=2)).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        assert wait_for(lambda: srv.metrics()["tessera_running"] == 2, 5)
        sock.close()
        assert wait_for(lambda: srv.metrics()["tessera_cancelled_total"] == 5, 5)
        assert wait_for(lambda: srv.metrics()["tessera_running"] == 0, 5)


def test_later_choices_keep_no_state_that_would_evict_a_conversation():
    """After an answer the idle worker keeps a state to reuse: a chat's next-turn prefix, or a
    completion's answer. Only a request's first choice of a prompt does: with each of n
    choices keeping one, a request of four choices would take four times the room in the
    snapshot pool and evict other conversations' prepared turns. A request of four choices
    makes as many snapshots as one of a single choice."""
    with Server("--parallel", "4") as srv:

        def turns():
            m = srv.metrics()
            return m["tessera_next_turn_ready_total"] + m["tessera_next_turn_abandoned_total"]

        def stores():
            return srv.metrics()["tessera_prefix_snapshot_stores_total"]

        first = chat("Tell me about the sea.", max_tokens=8)
        before = stores()
        a = srv.post_ok("/v1/chat/completions", first)
        assert wait_for(lambda: turns() == 1, 10)
        time.sleep(0.3)  # the idle work after it
        one = stores() - before
        assert one >= 1, one
        before = stores()
        srv.post_ok("/v1/chat/completions", chat("Something else entirely, please.", max_tokens=8,
                                               n=4, temperature=1.0, seed=1))
        assert wait_for(lambda: turns() == 2, 10)
        time.sleep(0.3)  # the idle work after it
        assert stores() - before == one, (stores() - before, one)
        assert srv.metrics()["tessera_prefix_snapshots"] == 2 * one
        follow = {"messages": first["messages"] + [
            {"role": "assistant", "content": a["choices"][0]["message"]["content"]},
            {"role": "user", "content": "And the sky?"}], "temperature": 0, "max_tokens": 4}
        r = srv.post_ok("/v1/chat/completions", follow)
        cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= a["usage"]["prompt_tokens"], (cached, a["usage"])
