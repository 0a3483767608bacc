"""The server on a GPU (`--device cuda`) answers the same with and without decoding ahead
(TESSERA_DECODE_AHEAD=0): greedy and seeded sampled chats, penalised and biased ones, a stop
string, a follow-up turn that reuses the conversation's prefix, and a stream. Decoding ahead
queues each next step before the
caller has seen the token (engine/ahead.c); a stop, a second turn or another request must drop
the held step without a trace. Skipped where the binary has no CUDA or there is no device."""
import json
import os
import re

import pytest

from server_util import Server, at_once, chat, fixtures, hold_conversations, tiny_model

LONG = {"max_tokens": 48}


def requests_for(srv):
    """The answers to a fixed list of requests, in order (content, finish reason, tokens)."""
    out = []

    def ask(body):
        status, _, r = srv.post("/v1/chat/completions", body)
        assert status == 200, r
        c = r["choices"][0]
        out.append((c["message"]["content"], c["finish_reason"], r["usage"]["completion_tokens"]))
        return c["message"]["content"]

    first = ask(chat("Tell me about the sea.", **LONG))
    ask(chat("Tell me about the sea.", temperature=0.8, seed=7, **LONG))
    ask(chat("Tell me about the sea.", temperature=0.9, min_p=0.05, seed=8, **LONG))
    ask(chat("Count to ten.", temperature=0.8, seed=9, max_tokens=40, stop=["e"]))
    # penalties: their lists grow by each token, and a held step gets them at its launch
    ask(chat("Tell me about the sea.", repetition_penalty=1.3, frequency_penalty=1.5,
             presence_penalty=0.5, **LONG))
    ask(chat("Tell me about the sea.", temperature=0.8, top_k=40, repetition_penalty=1.1,
             seed=10, **LONG))
    # logit_bias: entries of the same list, held steps get them at their launch too
    ask(chat("Tell me about the sea.", temperature=0.8, seed=11, repetition_penalty=1.2,
             logit_bias={str(t): 2.0 for t in range(100, 140)}, **LONG))
    # a thinking budget: the end put in replaces the held step's draws
    ask(chat("Tell me about the sea.", temperature=0.8, seed=13, thinking_token_budget=10,
             chat_template_kwargs={"enable_thinking": True}, **LONG))
    ask(chat("Tell me about the sea.", thinking_token_budget=3,
             chat_template_kwargs={"enable_thinking": True}, **LONG))
    # min_tokens: its bans are entries of the list too, lifted mid-answer under a held step
    _, _, t = srv.post("/tokenize", {"content": "<|im_end|>"})
    ask(chat("Tell me about the sea.", temperature=0.8, seed=12, min_tokens=12,
             logit_bias={str(t["tokens"][0]): 4.0}, stop_token_ids=[100, 101], **LONG))
    ask({"messages": [{"role": "user", "content": "Tell me about the sea."},
                      {"role": "assistant", "content": first},
                      {"role": "user", "content": "And the sky?"}],
         "temperature": 0, "max_tokens": 32})
    status, _, data = srv.request("POST", "/v1/chat/completions",
                                  chat("Say something.", temperature=0.7, seed=3, stream=True,
                                       max_tokens=40))
    assert status == 200
    text = ""
    for line in data.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for ch in json.loads(line[6:])["choices"]:
                text += ch["delta"].get("content") or ""
    out.append((text, None, None))
    return out


def answers(srv, path, bodies, together):
    """The first choice of each body's request on srv, one after another, or (together) all
    at once from threads."""
    out = [None] * len(bodies)

    def go(i):
        status, _, r = srv.post(path, bodies[i])
        assert status == 200, r
        out[i] = r["choices"][0]

    if not together:
        for i in range(len(bodies)):
            go(i)
        return out
    at_once(go, len(bodies))
    return out


def serve_cuda(env, *args, model=None):
    try:
        return Server("--device", "cuda", *args, env=env, model=model)
    except RuntimeError as e:
        pytest.skip(f"no CUDA server: {str(e).splitlines()[-1] if str(e) else e}")


def test_decoding_ahead_answers_the_same():
    answers = []
    for env in ({"TESSERA_DECODE_AHEAD": "0"}, {}):
        with serve_cuda(env) as srv:
            answers.append(requests_for(srv))
    for off, on in zip(*answers):
        assert off == on
    assert answers[1][3][1] == "stop"  # the stop string was met mid-way


def test_logit_bias_on_the_gpu():
    """logit_bias applied by the device's draws (test_server_logit_bias.py's checks)."""
    from test_server_logit_bias import (check_ban_holds_through_the_answer,
                                        check_bias_moves_the_first_token)

    with serve_cuda({}) as srv:
        check_bias_moves_the_first_token(srv)
        check_ban_holds_through_the_answer(srv)


def test_best_of_and_min_tokens_on_the_gpu():
    """best_of ranks the device's answers by their log-probabilities; min_tokens' bans hold
    in the device's draws (test_server_best_of.py's and test_server_stop_controls.py's checks)."""
    from test_server_best_of import check_best_of
    from test_server_stop_controls import check_min_tokens_bans_the_end

    with serve_cuda({}) as srv:
        check_best_of(srv)
        check_min_tokens_bans_the_end(srv)


def test_speculative_decoding_on_the_gpu():
    """Guesses checked in the GPU's batched forward and drawn on the host answer as the GPU's
    own decode steps do, greedy and sampled, with a grammar, stops and several choices; a right
    prediction saves a step a right guess (test_server_speculate.py's checks)."""
    import test_server_speculate as sp

    with serve_cuda({}, "--cache-mb", "0") as srv, \
            serve_cuda({}, "--cache-mb", "0", "--draft-max", "0") as plain:
        sp.test_a_right_prediction_gives_the_same_answer_in_fewer_steps(srv, plain)
        sp.test_a_wrong_prediction_changes_nothing_but_the_count(srv, plain)
        for kw in sp.SAMPLED:
            sp.test_draws_are_the_ones_without_guesses(srv, plain, kw)
        sp.test_several_choices_and_a_stream(srv, plain)
        sp.test_the_answer_ends_where_it_would(srv, plain)
        sp.test_a_grammar_constrains_the_guessed_tokens_too(srv, plain)


def test_thinking_budget_on_the_gpu():
    """The thinking budget's end put in for the device's draws, decoded ahead or guessed
    (test_server_thinking_budget.py's checks)."""
    import test_server_thinking_budget as tb

    with serve_cuda({}, "--alias", "tiny-test") as srv:
        tb.test_budget_ends_the_thinking(srv)
        tb.test_budget_zero_and_unbounded(srv)
        tb.test_budget_waits_for_a_character(srv)
        tb.test_stream_and_logprobs(srv)
        tb.test_guesses_do_not_pass_the_end(srv)
        tb.test_budget_then_grammar(srv)
        tb.test_responses_and_messages(srv)


def test_embeddings_on_the_gpu():
    """POST /v1/embeddings on the device: the numpy reference's vectors within issue 7's bf16
    tolerance, last and mean pooling, several inputs on the lanes together and a long one in
    chunks, beside a chat whose answer they do not change (test_server_embeddings.py's checks)."""
    import test_server_embeddings as te

    model = te.ref.load(tiny_model())
    for pooling in ("last", "mean"):
        with serve_cuda({}, "--pooling", pooling, "--prefill-chunk", "32") as srv:
            texts = [f"{te.TEXTS[i % 3]} number {i}" for i in range(20)]
            texts.append(" ".join(te.TEXTS * 4))  # over 32 tokens: in chunks
            r = srv.post_ok("/v1/embeddings", {"input": texts})
            for t, v in zip(texts, te.vectors(r)):
                te.close(v, te.want(model, te.ids_of(srv, t), mean=pooling == "mean"), 1e-2)
            if pooling == "last":
                te.check_embeddings_beside_a_chat(srv, model, 1e-2)


def test_choices_decode_together_on_the_gpu():
    """n choices on the GPU (`--parallel 4`): decoded in the same batched steps, greedy
    choices equal, sampled ones each of its own seed, and a stream of them whole."""
    with serve_cuda({}, "--parallel", "4") as srv:
        status, _, g = srv.post("/v1/chat/completions",
                                chat("Tell me about the sea.", max_tokens=40, n=3,
                                     ignore_eos=True))
        assert status == 200, g
        assert len({c["message"]["content"] for c in g["choices"]}) == 1
        body = chat("Tell me about the sea.", max_tokens=40, n=4, temperature=1.0, seed=5,
                    ignore_eos=True, return_token_ids=True)
        status, _, r = srv.post("/v1/chat/completions", body)
        assert status == 200, r
        assert [len(c["token_ids"]) for c in r["choices"]] == [40] * 4
        assert len({tuple(c["token_ids"]) for c in r["choices"]}) == 4
        assert r["usage"]["completion_tokens"] == 160
        status, _, data = srv.request("POST", "/v1/chat/completions", dict(body, stream=True))
        assert status == 200
        ends = [json.loads(line[6:])["choices"][0]["index"]
                for line in data.decode().splitlines()
                if line.startswith("data: {") and '"finish_reason":"length"' in line]
        assert sorted(ends) == [0, 1, 2, 3]
        m = srv.metrics()
        assert m["tessera_running"] == 0 and m["tessera_queue_depth"] == 0


def test_echo_scores_on_the_gpu():
    """A prompt scored by echo (its rows from the GPU's prefill) against the log-probabilities
    its tokens got when the GPU drew them (test_server_echo.py's check)."""
    from test_server_echo import check_prompt_scores_match_the_answers

    with serve_cuda({}) as srv:
        check_prompt_scores_match_the_answers(srv, 2e-3)


def test_gpu_prefills_a_long_prompt_in_one_call():
    """On a GPU a prompt goes in chunks of 2048 tokens (one forward call for this one; a
    CPU server takes 256): the same tokens as in chunks of 256."""
    body = {"prompt": "The quick brown fox jumps over the lazy dog. " * 60, "max_tokens": 16,
            "temperature": 0, "return_token_ids": True}
    answers = []
    for args in ((), ("--prefill-chunk", "256")):
        with serve_cuda({}, *args) as srv:
            calls0 = srv.metrics()["tessera_prefill_calls_total"]
            status, _, r = srv.post("/v1/completions", body)
            assert status == 200, r
            n = r["usage"]["prompt_tokens"]
            calls = srv.metrics()["tessera_prefill_calls_total"] - calls0
            assert calls == ((n + 255) // 256 if args else 1), (n, calls)
            answers.append(r["choices"][0]["token_ids"])
    assert answers[0] == answers[1]


def test_requests_decode_together_on_the_gpu():
    """Several requests at once on the GPU (`--parallel 4`): one batched decode step for all,
    lanes joining and leaving as requests start and end. A batch of several sequences goes
    through the GEMMs instead of the one sequence's GEMVs, so its logits may differ from the
    same request alone in the last bits: each greedy answer must be the one it gets alone
    until the two meet a near tie (the alone run's two best log-probabilities within 0.05),
    with the same log-probabilities up to there; sampled ones must complete."""
    greedy = [{"prompt": p, "max_tokens": n, "temperature": 0, "logprobs": 2,
               "return_token_ids": True, **extra}
              for p, n, extra in (("The sea is", 40, {}), ("Once upon a time " * 8, 23, {}),
                                  ("A B C D", 31, {"repetition_penalty": 1.3,
                                                   "frequency_penalty": 0.5}),
                                  ("Numbers: 1, 2,", 12, {}), ("x", 50, {}))]
    sampled = [{"prompt": "Say something.", "max_tokens": 30, "temperature": 0.8, "seed": s,
                "top_k": 40} for s in range(3)]
    with serve_cuda({}, "--parallel", "4") as srv:
        alone = answers(srv, "/v1/completions", greedy, False)
        together = answers(srv, "/v1/completions", greedy + sampled, True)
        m = srv.metrics()
        assert m["tessera_running"] == 0 and m["tessera_queue_depth"] == 0
    for b, a, t in zip(greedy, alone, together):
        assert t is not None and len(t["token_ids"]) == b["max_tokens"]
        ia, it = a["token_ids"], t["token_ids"]
        k = next((i for i in range(len(ia)) if ia[i] != it[i]), len(ia))
        la, lt = a["logprobs"]["token_logprobs"], t["logprobs"]["token_logprobs"]
        assert all(abs(x - y) < 0.05 for x, y in zip(la[:k], lt[:k])), (b, k)
        if k < len(ia):
            top = sorted(a["logprobs"]["top_logprobs"][k].values(), reverse=True)
            assert top[0] - top[1] < 0.05, (b, k, top)
    for b, t in zip(sampled, together[len(greedy):]):
        assert t is not None and t["finish_reason"] in ("length", "stop")


def test_images_on_the_gpu(tmp_path):
    """A request with two images on the GPU: the tower runs there (no 400), the answer is the
    one `tessera run --device cuda` gives for the same turn, and its log-probabilities are the
    CPU server's within bf16-level noise up to the first near tie."""
    import subprocess

    from server_util import binary
    from test_server_vision import tiny_vl_model, two_images_turn

    body, cli = two_images_turn(tmp_path, logprobs=True, top_logprobs=2)
    answers = []
    for gpu in (True, False):
        with (serve_cuda({}, model=tiny_vl_model()) if gpu else
              Server(model=tiny_vl_model())) as srv:
            status, _, r = srv.post("/v1/chat/completions", body)
            assert status == 200, r
            answers.append(r["choices"][0])
    out = subprocess.run([binary(), *cli, "--device", "cuda"], capture_output=True, check=True,
                         text=True)
    gpu, cpu = answers
    assert [int(t) for t in out.stdout.split()] == gpu["token_ids"]
    ig, ic = gpu["token_ids"], cpu["token_ids"]
    k = next((i for i in range(len(ig)) if ig[i] != ic[i]), len(ig))
    lg = [t["logprob"] for t in gpu["logprobs"]["content"]]
    lc = [t["logprob"] for t in cpu["logprobs"]["content"]]
    assert all(abs(x - y) < 0.05 for x, y in zip(lg[:k], lc[:k])), (lg, lc)
    if k < len(ic):
        top = [t["logprob"] for t in cpu["logprobs"]["content"][k]["top_logprobs"]]
        assert top[0] - top[1] < 0.05, (k, top)


def test_image_and_text_lanes_decode_together_on_the_gpu(tmp_path):
    """Lanes after images decode in one step with a text lane (`--parallel 3`): each lane's
    text runs from its cache row by its own rotary shift (the images' delta; 0 for the text),
    which the fused attention step takes per sequence. Each answer must be the one it gets
    alone until a near tie, with the same log-probabilities up to there. The model is fp32: a
    batch's sums differ from one sequence's by ~1e-6 here, and a lane given another lane's
    shift by ~1e-2 (the random model's two best tokens are often within 0.05, so the
    tolerance that bf16 needs would let that pass)."""
    from test_server_vision import tiny_vl_model, two_images_turn

    img, _ = two_images_turn(tmp_path, max_tokens=64, logprobs=True, top_logprobs=2)
    one = dict(img, messages=[{"role": "user", "content": [img["messages"][0]["content"][0],
                                                           {"type": "text", "text": "what?"}]}])
    text = {"messages": [{"role": "user", "content": "Tell me about the sea."}],
            "temperature": 0, "max_tokens": 200, "return_token_ids": True, "ignore_eos": True,
            "logprobs": True, "top_logprobs": 2}
    bodies = [img, one, text]
    with serve_cuda({}, "--parallel", "3", model=tiny_vl_model()) as srv:
        alone = answers(srv, "/v1/chat/completions", bodies, False)
        together = answers(srv, "/v1/chat/completions", bodies, True)
    for b, a, t in zip(bodies, alone, together):
        assert t is not None and len(t["token_ids"]) == b["max_tokens"]
        ia, it = a["token_ids"], t["token_ids"]
        k = next((i for i in range(len(ia)) if ia[i] != it[i]), len(ia))
        la = [x["logprob"] for x in a["logprobs"]["content"]]
        lt = [x["logprob"] for x in t["logprobs"]["content"]]
        assert all(abs(x - y) < 1e-3 for x, y in zip(la[:k], lt[:k])), (k, la, lt)
        if k < len(ia):
            top = [x["logprob"] for x in a["logprobs"]["content"][k]["top_logprobs"]]
            assert top[0] - top[1] < 1e-3, (k, top)


def test_the_warm_up_runs_the_vision_tower():
    """On a GPU the server warms up before it says it is ready; with a model that reads images
    the warm-up puts an image through the tower too, so that the first request with an image
    does not pay for its first use (worker.c, warm_up_vision)."""
    import time

    from test_server_vision import tiny_vl_model

    def ready_line(srv):  # /health answers before the main thread prints the line
        for _ in range(100):
            m = re.search(r"tessera: ready: .*\n", srv.stderr())
            if m:
                return m.group(0)
            time.sleep(0.05)
        return srv.stderr()

    with serve_cuda({}, model=tiny_vl_model()) as srv:
        line = ready_line(srv)
    assert re.search(r"; warmed up in \d+ ms \(the vision tower too\)\n", line), line
    with serve_cuda({}) as srv:
        line = ready_line(srv)
    assert re.search(r"; warmed up in \d+ ms\n", line), line


def test_prefix_snapshots_on_the_gpu():
    """Prefix snapshots in the device's pool (engine/snapshot.c): eight conversations held at
    once in --cache-mb 2 (a whole slot's state would fill it), each follow-up restored from its
    own and scored as a server without the cache scores it (the first token's alternatives;
    a batch of one token more or less may move their last bits); the same prompt again is
    restored whole, its answer the same."""
    with serve_cuda({}, "--cache-mb", "2") as srv, serve_cuda({}, "--cache-mb", "0") as plain:
        convs, first = hold_conversations(srv, 8)
        assert srv.metrics()["tessera_prefix_snapshots"] >= 8
        for msgs, n in zip(convs, first):
            body = {"messages": msgs, "max_tokens": 4, "temperature": 0, "logprobs": True,
                    "top_logprobs": 5}
            r = srv.post_ok("/v1/chat/completions", body)
            assert r["usage"]["prompt_tokens_details"]["cached_tokens"] >= n - 4, r["usage"]
            p = plain.post_ok("/v1/chat/completions", body)
            a = {t["token"]: t["logprob"] for t in r["choices"][0]["logprobs"]["content"][0]
                 ["top_logprobs"]}
            b = {t["token"]: t["logprob"] for t in p["choices"][0]["logprobs"]["content"][0]
                 ["top_logprobs"]}
            common = set(a) & set(b)
            assert len(common) >= 4 and all(abs(a[t] - b[t]) < 2e-2 for t in common), (a, b)
            again = srv.post_ok("/v1/chat/completions", body)
            assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == \
                again["usage"]["prompt_tokens"]
            assert again["choices"][0]["message"] == r["choices"][0]["message"]


def test_lora_adapters_on_the_gpu(tmp_path):
    """LoRA adapters on the GPU: each request's adapter as on the CPU (greedy tokens, their
    log-probabilities within float tolerance), and requests with different adapters decoded
    together (steps held ahead and graphs replayed with the per-token scales) as alone."""
    from test_server_lora import answer, write_adapter
    a = write_adapter(str(tmp_path / "a"), tiny_model(), 1)
    b = write_adapter(str(tmp_path / "b"), tiny_model(), 2)
    asks = [[], [{"id": 0, "scale": 1}], [{"id": 1, "scale": 0.7}, {"id": 0, "scale": -0.5}]]
    args = ("--lora", a, "--lora", b, "--lora-init-without-apply", "--cache-mb", "0")

    def close(g, w):
        return g[0] == w[0] and max(abs(x - y) for x, y in zip(g[1], w[1])) < 2e-2

    with serve_cuda({}, *args, "--parallel", "3") as srv, Server(*args) as cpu:
        alone = [answer(srv, lora=x) for x in asks]
        assert len({json.dumps(g[:2]) for g in alone}) == 3
        for x, g in zip(asks, alone):
            w = answer(cpu, lora=x)
            assert close(g, w), (x, g, w)
        together = [None] * 6

        def ask(i):
            together[i] = answer(srv, lora=asks[i % 3])

        at_once(ask, 6)
        for i, g in enumerate(together):
            assert close(g, alone[i % 3]), (i, g, alone[i % 3])


def test_mtp_drafts_on_the_gpu(tmp_path):
    """The MTP block's guesses on the GPU (its rows following every forward, its drafts for all
    lanes in one call): answers as the GPU's own plain steps give them, in fewer steps
    (test_server_mtp.py's checks)."""
    import test_server_mtp as tm
    model = tm.mtp_model(str(tmp_path))
    prompt = tm.read_ids(os.path.join(fixtures(), "qwen35_mtp", "tiny_mtp", "ref",
                                      "greedy.ids"), 0)
    with serve_cuda({}, "--draft-mtp", "2", "--cache-mb", "0", model=model) as srv, \
            serve_cuda({}, "--draft-max", "0", "--cache-mb", "0", model=model) as plain:
        tm.test_greedy_answer_is_the_same_in_fewer_steps(srv, plain, prompt)
        for kw in tm.SAMPLED:
            tm.test_draws_are_the_ones_without_guesses(srv, plain, prompt, kw)
        tm.test_requests_at_once_each_as_alone(srv, plain, prompt)
