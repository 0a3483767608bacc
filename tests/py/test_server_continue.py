"""vLLM's continue_final_message and add_generation_prompt on chat requests: the final message is
left open and the answer continues it, the prompt rendered as transformers renders it
(tests/unit/test_chat.c holds the renderings against transformers'); without a generation prompt
the assistant's turn is not opened. The answer is only the continuation."""
import time

from server_util import Server

MSGS = [{"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "Sure: the "}]


def test_the_answer_continues_the_final_message():
    with Server() as srv:
        body = {"messages": MSGS, "continue_final_message": True, "add_generation_prompt": False}
        ids = srv.post_ok("/tokenize", body)["tokens"]
        end = srv.post_ok("/tokenize", {"content": "<|im_end|>"})["tokens"][0]
        tail = srv.post_ok("/tokenize", {"content": "Sure: the"})["tokens"]
        assert ids[-len(tail):] == tail and end not in ids[-len(tail) - 3:]
        # add_generation_prompt false is implied by continue_final_message
        assert srv.post_ok("/tokenize", {"messages": MSGS, "continue_final_message": True})[
            "tokens"] == ids
        chat = srv.post_ok("/v1/chat/completions", dict(
            body, max_tokens=12, temperature=0, ignore_eos=True, return_token_ids=True))
        assert chat["usage"]["prompt_tokens"] == len(ids)
        # the same prompt's ids as a raw completion: the same answer
        raw = srv.post_ok("/v1/completions", {"prompt": ids, "max_tokens": 12, "temperature": 0,
                                           "ignore_eos": True, "return_token_ids": True})
        assert chat["choices"][0]["token_ids"] == raw["choices"][0]["token_ids"]
        # without it the model starts a new turn: another prompt
        plain = srv.post_ok("/tokenize", {"messages": MSGS})["tokens"]
        assert plain[:len(ids) - len(tail)] == ids[:-len(tail)] and plain != ids


def test_no_generation_prompt():
    with Server() as srv:
        msgs = [{"role": "user", "content": "Hi"}]
        with_prompt = srv.post_ok("/tokenize", {"messages": msgs})["tokens"]
        without = srv.post_ok("/tokenize", {"messages": msgs, "add_generation_prompt": False})[
            "tokens"]
        start = srv.post_ok("/tokenize", {"content": "<|im_start|>"})["tokens"][0]
        assert with_prompt[:len(without)] == without
        assert with_prompt[len(without)] == start and start not in with_prompt[len(without) + 1:]
        r = srv.post_ok("/v1/chat/completions", {"messages": msgs, "add_generation_prompt": False,
                                               "max_tokens": 3, "ignore_eos": True})
        assert r["usage"]["prompt_tokens"] == len(without)


def test_no_next_turn_is_prepared_from_a_continued_message():
    with Server() as srv:
        m0 = srv.metrics()["tessera_next_turn_ready_total"]
        srv.post_ok("/v1/chat/completions", {"messages": MSGS, "continue_final_message": True,
                                           "max_tokens": 4})
        time.sleep(0.5)
        srv.settle()
        assert srv.metrics()["tessera_next_turn_ready_total"] == m0
        # a usual chat answer does get its next turn prepared (the check above can fail)
        srv.post_ok("/v1/chat/completions", {"messages": MSGS[:1], "max_tokens": 4})
        time.sleep(0.5)
        srv.settle()
        assert srv.metrics()["tessera_next_turn_ready_total"] == m0 + 1


def test_an_empty_final_message_is_continued():
    # null content is the empty text here (as for any assistant message): the answer starts
    # the assistant's content itself
    with Server() as srv:
        for content in (None, ""):
            r = srv.post_ok("/v1/chat/completions", {
                "messages": MSGS[:1] + [{"role": "assistant", "content": content}],
                "continue_final_message": True, "max_tokens": 2, "ignore_eos": True})
            assert r["usage"]["completion_tokens"] == 2


def test_refused():
    with Server() as srv:
        for body, param in (
                ({"messages": MSGS, "continue_final_message": True,
                  "add_generation_prompt": True}, "add_generation_prompt"),
                ({"messages": MSGS, "continue_final_message": "yes"}, "continue_final_message"),
                # the template moves inline reasoning: transformers refuses to continue it
                ({"messages": MSGS[:1] + [{"role": "assistant", "content": "<think>r</think>It"}],
                  "continue_final_message": True}, "messages")):
            status, _, e = srv.post("/v1/chat/completions", body)
            assert status == 400 and e["error"]["param"] == param, (body, e)
