"""Prefix reuse: a multi-turn conversation gives the same tokens with and without the snapshot
cache (temperature 0), reports the reused prompt tokens, the follow-up's time to first token
drops, and an identical prompt is answered from its snapshot and stored logits with no
prefill."""
import json
import time

import pytest

from server_util import Server, hold_conversations

SYSTEM = "You are a helpful assistant. " + "Remember these facts carefully. " * 300
QUESTIONS = ["What is the capital of France?", "And of Italy?", "Which one is larger?"]


def converse(srv, turns=QUESTIONS, max_tokens=24, wait=False):
    """wait: give the worker the time a person reading the answer would (until the next turn's
    prefix is prepared) before each follow-up."""
    client = srv.client()
    msgs = [{"role": "system", "content": SYSTEM}]
    out = []
    if wait:
        srv.settle()
    for q in turns:
        msgs.append({"role": "user", "content": q})
        before = srv.next_turns()
        r = client.chat.completions.create(model="serve-tiny", messages=msgs, temperature=0,
                                           max_tokens=max_tokens, logprobs=True)
        text = r.choices[0].message.content
        toks = [t.token for t in r.choices[0].logprobs.content]
        out.append((text, toks, r.usage))
        msgs.append({"role": "assistant", "content": text})
        if wait:
            srv.wait_next_turn(before)
    return out


@pytest.fixture(scope="module")
def warm():
    with Server() as s:
        yield s


@pytest.fixture(scope="module")
def cold():
    with Server("--cache-mb", "0") as s:
        yield s


def test_multi_turn_identical_with_and_without_cache(warm, cold):
    a = converse(warm, wait=True)
    b = converse(cold)
    for (ta, ka, ua), (tb, kb, ub) in zip(a, b):
        assert ka == kb
        assert ta == tb
        assert ua.prompt_tokens == ub.prompt_tokens
        assert ub.prompt_tokens_details.cached_tokens == 0
    # later turns reuse the previous prompt up to its generation prompt, and the answer (the
    # template renders earlier answers differently from how they were generated, so the
    # worker prepared that prefix while the client read the answer)
    for i in (1, 2):
        cached = a[i][2].prompt_tokens_details.cached_tokens
        assert cached >= a[i - 1][2].prompt_tokens - 16, (i, cached)
        assert cached < a[i][2].prompt_tokens


def test_immediate_follow_up_identical(warm, cold):
    """A follow-up sent at once (before the next turn could be prepared) reuses less but still
    gives the same tokens."""
    a = converse(warm, turns=["Quick one?", "And again?"], max_tokens=8)
    b = converse(cold, turns=["Quick one?", "And again?"], max_tokens=8)
    assert [x[:2] for x in a] == [x[:2] for x in b]


def prefilled(srv):
    return srv.metrics()["tessera_prefill_tokens_total"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_identical_prompt_needs_no_prefill(warm, cold, path):
    """The same prompt again restores the snapshot of the whole prompt and samples its first
    token from the stored logits row: every prompt token is cached, none is prefilled, and the
    output (tokens and logprobs) is that of a server without the cache, with or without
    penalties (they apply to the stored row as they would to fresh logits)."""
    if path == "/v1/chat/completions":
        body = {"messages": [{"role": "user", "content": "repeat me " * 40}],
                "logprobs": True, "top_logprobs": 3}
    else:
        body = {"prompt": "say it again " * 30, "logprobs": 3}
    body.update(max_tokens=8, temperature=0, return_token_ids=True)
    # the first one has penalties: the row kept must be the model's, not the penalised one
    again = dict(body, repetition_penalty=1.3, frequency_penalty=0.5)
    st, _, r1 = warm.post(path, again)
    assert st == 200, r1
    n = r1["usage"]["prompt_tokens"]
    assert r1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    for b in (body, again):
        before = prefilled(warm)
        st, _, r2 = warm.post(path, b)
        assert st == 200, r2
        assert r2["usage"]["prompt_tokens"] == n
        assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == n
        assert prefilled(warm) - before == 0
        st, _, c = cold.post(path, b)
        assert c["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert r2["choices"][0]["token_ids"] == c["choices"][0]["token_ids"]
        assert r2["choices"][0]["logprobs"] == c["choices"][0]["logprobs"]
        if b is again:
            assert r2["choices"][0]["token_ids"] == r1["choices"][0]["token_ids"]


def test_new_prompt_prefills_every_token_once(warm):
    """A prompt no snapshot is a prefix of: all of it is prefilled, nothing twice."""
    body = {"prompt": "a brand new prompt about otters " * 12, "max_tokens": 2,
            "temperature": 0}
    before = prefilled(warm)
    st, _, r = warm.post("/v1/completions", body)
    assert st == 200
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert prefilled(warm) - before == r["usage"]["prompt_tokens"]


def test_completion_continuation_uses_answer_snapshot(warm, cold):
    # a raw completion continued by the client: prompt + answer ids extend the answer snapshot
    st, _, t = warm.post("/tokenize", {"content": "In the beginning " * 20})
    ids = t["tokens"]
    body = {"prompt": ids, "max_tokens": 12, "temperature": 0, "return_token_ids": True}
    st, _, r = warm.post("/v1/completions", body)
    out = r["choices"][0]["token_ids"]
    assert st == 200 and len(out) == 12
    st, _, c = cold.post("/v1/completions", body)
    assert c["choices"][0]["token_ids"] == out
    more = {"prompt": ids + out + [5, 6, 7], "max_tokens": 10, "temperature": 0,
            "return_token_ids": True}
    # the answer's state is kept once the worker is idle (a client that comes back at once
    # prefills the answer instead); give it the time a client reading the text would
    time.sleep(0.5)
    st, _, r2 = warm.post("/v1/completions", more)
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == len(ids) + len(out)
    st, _, c2 = cold.post("/v1/completions", more)
    assert c2["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert r2["choices"][0]["token_ids"] == c2["choices"][0]["token_ids"]


def test_waiting_continuation_starts_from_the_working_state(cold):
    """A continuation already queued when the answer ends - so the worker keeps no snapshot of
    the answer - starts from the state the answer left in the working slot: all of prompt and
    answer but the answer's last token (never run) is reused, and the tokens match a cold run."""
    st, _, t = cold.post("/tokenize", {"content": "Once upon a time " * 20})
    ids = t["tokens"]
    body = {"prompt": ids, "max_tokens": 12, "temperature": 0, "return_token_ids": True}
    st, _, c = cold.post("/v1/completions", body)
    out = c["choices"][0]["token_ids"]
    assert st == 200 and len(out) == 12
    more = {"prompt": ids + out + [5, 6, 7], "max_tokens": 6, "temperature": 0,
            "return_token_ids": True}
    st, _, c2 = cold.post("/v1/completions", more)
    # one lane: the follow-up waits in the queue while the first request decodes
    with Server("--debug-step-delay-ms", "40", "--parallel", "1") as s:
        import threading
        first = {}
        t1 = threading.Thread(target=lambda: first.update(r=s.post("/v1/completions", body)))
        t1.start()
        time.sleep(0.25)  # the first is decoding (12 steps of 40 ms); the second queues
        st2, _, r2 = s.post("/v1/completions", more)
        t1.join()
        assert first["r"][0] == 200 and first["r"][2]["choices"][0]["token_ids"] == out
        assert st2 == 200
        assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == len(ids) + len(out) - 1
        assert r2["choices"][0]["token_ids"] == c2["choices"][0]["token_ids"]


def ttft(srv, msgs):
    c = srv.client()
    t0 = time.perf_counter()
    stream = c.chat.completions.create(model="serve-tiny", messages=msgs, temperature=0,
                                       max_tokens=4, stream=True)
    first = None
    for ch in stream:
        if first is None and ch.choices and ch.choices[0].delta.content is not None \
                and ch.choices[0].delta.role is None:
            first = time.perf_counter() - t0
    return first if first is not None else time.perf_counter() - t0


def test_follow_up_ttft_drops(warm, cold):
    long_system = "Context: " + "the quick brown fox jumps over the lazy dog. " * 160
    msgs = [{"role": "system", "content": long_system}, {"role": "user", "content": "Hi"}]
    c = warm.client()
    warm.settle()
    before = warm.next_turns()
    r = c.chat.completions.create(model="serve-tiny", messages=msgs, temperature=0, max_tokens=8)
    warm.wait_next_turn(before)  # the client reads the answer
    follow = msgs + [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": "Tell me more."}]
    warm_t = min(ttft(warm, follow + [{"role": "user", "content": f"#{i}"}]) for i in range(3))
    cold_t = min(ttft(cold, follow + [{"role": "user", "content": f"#{i}"}]) for i in range(3))
    assert warm_t < cold_t, (warm_t, cold_t)


# ---- the next turn's prefix: the answer is reused too ------------------------------------


def im_start(srv):
    st, _, t = srv.post("/tokenize", {"content": "<|im_start|>"})
    assert st == 200 and len(t["tokens"]) == 1
    return t["tokens"][0]


@pytest.mark.parametrize("think", [False, True])
def test_follow_up_prefills_only_the_new_turn(warm, cold, think):
    """Turn k's cached tokens cover everything up to its new user turn: the history, the
    previous answer (re-rendered by the template without its think block) included. Outputs
    match a server without the cache, in thinking and non-thinking mode."""
    extra = {"chat_template_kwargs": {"enable_thinking": think}}
    start = im_start(warm)
    warm.settle()
    msgs = [{"role": "system", "content": "Answer in one short sentence. " * 30}]
    for turn, q in enumerate(QUESTIONS):
        msgs.append({"role": "user", "content": f"{q} (think={think})"})
        body = dict(messages=msgs, temperature=0, max_tokens=12, return_token_ids=True, **extra)
        before = warm.next_turns()
        st, _, r = warm.post("/v1/chat/completions", body)
        assert st == 200, r
        st, _, c = cold.post("/v1/chat/completions", body)
        assert r["choices"][0]["token_ids"] == c["choices"][0]["token_ids"]
        assert r["choices"][0]["message"] == c["choices"][0]["message"]
        assert c["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        st, _, t = warm.post("/tokenize", {"messages": msgs, **extra})
        assert t["count"] == r["usage"]["prompt_tokens"]
        turns = [i for i, x in enumerate(t["tokens"]) if x == start]
        if turn > 0:
            # everything before "<|im_start|>user" of the new question came from a snapshot
            assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == turns[-2], (turn, turns)
        warm.wait_next_turn(before)
        m = r["choices"][0]["message"]
        a = {"role": "assistant", "content": m["content"]}
        if m.get("reasoning_content"):
            a["reasoning_content"] = m["reasoning_content"]
        if think:
            assert m.get("reasoning_content")  # the random model never closes its thinking
        msgs.append(a)


def test_next_turn_yields_to_a_waiting_request():
    """While a request waits, the worker does not prepare the finished chat's next turn (one
    lane: the second request queues behind the first and takes its lane)."""
    with Server("--debug-step-delay-ms", "20", "--parallel", "1") as s:
        done = []

        def one(i):
            st, _, r = s.post("/v1/chat/completions",
                              {"messages": [{"role": "user", "content": f"hello {i}"}],
                               "max_tokens": 10, "temperature": 0})
            done.append(st)

        import threading
        t1 = threading.Thread(target=one, args=(1,))
        t1.start()
        time.sleep(0.1)  # the first one runs, the second one queues behind it
        t2 = threading.Thread(target=one, args=(2,))
        t2.start()
        t1.join()
        t2.join()
        assert done == [200, 200]
        s.wait_next_turn(1)
        m = s.metrics()
        assert m["tessera_next_turn_abandoned_total"] >= 1
        assert m["tessera_next_turn_ready_total"] <= 1


def test_prompt_in_small_chunks_answers_the_same(cold):
    """A prompt prefilled a few tokens a forward call (`--prefill-chunk 7`: a GPU server takes
    2048 a call, a CPU one 256) continues the sequence exactly where one forward would: the
    same tokens and log-probabilities, every prompt token prefilled once. A chunk of 0 is
    refused at start."""
    body = {"prompt": "The quick brown fox jumps over the lazy dog. " * 6, "max_tokens": 12,
            "temperature": 0, "logprobs": 2, "return_token_ids": True}
    def calls(srv):
        return srv.metrics()["tessera_prefill_calls_total"]

    with Server("--prefill-chunk", "7") as small:
        before, calls0 = prefilled(small), calls(small)
        st, _, r = small.post("/v1/completions", body)
        assert st == 200, r
        n = r["usage"]["prompt_tokens"]
        assert n > 3 * 7 and prefilled(small) - before == n
        assert calls(small) - calls0 == (n + 6) // 7
        calls0 = calls(cold)
        st, _, c = cold.post("/v1/completions", body)
        assert st == 200, c
        assert c["usage"]["prompt_tokens"] == n and calls(cold) - calls0 == 1
        assert r["choices"][0]["token_ids"] == c["choices"][0]["token_ids"]
        a, b = r["choices"][0]["logprobs"], c["choices"][0]["logprobs"]
        assert a["tokens"] == b["tokens"]
        assert a["token_logprobs"] == pytest.approx(b["token_logprobs"], abs=1e-3)
    with pytest.raises(RuntimeError):
        Server("--prefill-chunk", "0")


def test_snapshots_take_the_room_of_their_tokens():
    """A snapshot keeps only what its tokens use of the state (the summed-up state and their
    KV rows), not a whole context's: with --cache-mb 1 and a context of 4096 (a whole slot's
    state of the tiny model is ~1 MiB, so one snapshot would fill it) twelve conversations of
    a few dozen tokens all keep their state, and each follow-up reuses its conversation;
    a conversation's snapshot is restored exactly (the same answer as without the cache)."""
    with Server("--cache-mb", "1", "--ctx", "4096") as srv, \
            Server("--cache-mb", "0", "--ctx", "4096") as plain:
        for _ in range(100):
            if "prefix snapshots in" in srv.stderr():
                break
            time.sleep(0.02)
        assert "prefix snapshots in 1 MiB" in srv.stderr(), srv.stderr()
        convs, first = hold_conversations(srv, 12)
        m = srv.metrics()
        assert m["tessera_prefix_snapshots"] >= 12, m
        assert m["tessera_prefix_snapshot_bytes"] <= 1 << 20, m
        for msgs, n in zip(convs, first):
            body = {"messages": msgs, "max_tokens": 6, "temperature": 0}
            r = srv.post_ok("/v1/chat/completions", body)
            # the first prompt, up to its assistant turn (rendered otherwise once answered)
            assert r["usage"]["prompt_tokens_details"]["cached_tokens"] >= n - 4, (r["usage"], n)
            assert r["choices"][0]["message"] == plain.post_ok("/v1/chat/completions",
                                                               body)["choices"][0]["message"]
