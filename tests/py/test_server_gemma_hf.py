"""A Gemma 3 checkpoint in Hugging Face's form: a directory with config.json, safetensors, the
SentencePiece tokenizer converted to tokenizer.json (characters with byte fallback, spaces as
U+2581), tokenizer_config.json with the chat template, generation_config.json. The model is a
tiny random Gemma 3 of the fixtures, the tokenizer the small Gemma-style stand-in
(tools/make_gemma_tokenizer.py small).

What the server makes of text is what transformers' AutoTokenizer makes of the same
directory: plain text (with the <bos> of the tokenizer.json's post-processor), chat rendered by
Gemma's template, decoding; and generation ends on the ids generation_config.json names."""
import glob
import json
import os
import shutil
import sys

import pytest

from server_util import REPO, Server, fixtures
from test_server_tools import FORCED, check_calls  # the same tools, in the list form

transformers = pytest.importorskip("transformers", reason="pip install transformers")
sys.path.insert(0, os.path.join(REPO, "tools"))
from gen_gemma_chat_fixtures import GEMMA3_TEMPLATE  # noqa: E402

MODEL = sorted(glob.glob(os.path.join(fixtures(), "gemma3", "tiny_a_*")))[0]

TEXTS = [
    "Hello world",
    "  leading spaces,\ttabs\tand\n\n\nnew lines  ",
    "caf\u00e9 \u00fcber na\u00efve \u65e5\u672c\u8a9e \U0001f600",  # beyond the 70 characters
    "the <start_of_turn>user turn token, <start_of_image> and \u2581\u2581\u2581\u2581 literal",
    "and so to the end of the end",  # " the end" is matched after normalization
    "",
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"},
     {"role": "user", "content": "  and caf\u00e9\u2615 ?"}],
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    dst = str(tmp_path_factory.mktemp("gemma") / "m")
    shutil.copytree(MODEL, dst, ignore=shutil.ignore_patterns("ref", "config.*.json"))
    shutil.copy(os.path.join(fixtures(), "tokenizer", "small_gemma", "tokenizer.json"), dst)
    with open(os.path.join(dst, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>",
                   "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>",
                   "chat_template": GEMMA3_TEMPLATE}, f)
    with open(os.path.join(dst, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 2, "eos_token_id": [1, 262]}, f)  # <eos>, <end_of_turn>
    return dst


@pytest.fixture(scope="module")
def hf(model_dir):
    return transformers.AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def server(model_dir):
    with Server(model=model_dir) as s:
        yield s


def chat_ids(hf, messages):
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return hf(text, add_special_tokens=False)["input_ids"]


def test_text_is_tokenized_as_transformers_does(server, hf):
    """vLLM's {"prompt"} adds the post-processor's <bos> (unless add_special_tokens is
    false), llama-server's {"content"} does not (unless add_special); with_pieces gives each
    token's text, or its bytes where they are part of a character."""
    for text in TEXTS:
        want = hf(text)["input_ids"]
        assert want[0] == 2  # the post-processor's <bos>
        assert server.post_ok("/tokenize", {"prompt": text})["tokens"] == want, text
        assert server.post_ok("/tokenize", {"content": text, "add_special": True})[
            "tokens"] == want, text
        assert server.post_ok("/tokenize", {"content": text})["tokens"] == want[1:], text
        assert server.post_ok("/tokenize", {"prompt": text, "add_special_tokens": False})[
            "tokens"] == want[1:], text
    text = TEXTS[2]  # its emoji is beyond the vocabulary: byte tokens
    p = server.post_ok("/tokenize", {"content": text, "with_pieces": True})["tokens"]
    assert [t["id"] for t in p] == hf(text, add_special_tokens=False)["input_ids"]
    joined = b"".join(bytes(t["piece"]) if isinstance(t["piece"], list)
                      else t["piece"].encode() for t in p)
    assert joined.decode().replace("\u2581", " ") == text
    assert any(isinstance(t["piece"], list) for t in p), p
    st, _, e = server.post("/tokenize", {"content": text, "add_special": "yes"})
    assert st == 400 and e["error"]["param"] == "add_special", e


def test_chat_is_rendered_and_tokenized_as_transformers_does(server, hf):
    for messages in CONVERSATIONS:
        want = chat_ids(hf, messages)
        assert server.post_ok("/tokenize", {"messages": messages})["tokens"] == want
        r = server.post_ok("/v1/chat/completions", {"messages": messages, "max_tokens": 2})
        assert r["usage"]["prompt_tokens"] == len(want)


def test_decoding_matches_transformers(server, hf):
    """Byte pieces (U+00E9 and the emoji come as <0xXX> runs), U+2581 back to spaces, an
    unfinished run as one U+FFFD a byte, special tokens kept."""
    for text in TEXTS:
        ids = hf(text)["input_ids"]
        got = server.post_ok("/detokenize", {"tokens": ids})["content"]
        assert got == hf.decode(ids, skip_special_tokens=False), text
    e_acute = hf("\u00e9", add_special_tokens=False)["input_ids"]
    smile = hf("\U0001f600", add_special_tokens=False)["input_ids"]
    assert len(e_acute) == 2 and len(smile) == 4  # byte pieces
    ids = smile[:2] + [300] + e_acute
    got = server.post_ok("/detokenize", {"tokens": ids})["content"]
    assert got == hf.decode(ids) and got.startswith("\ufffd\ufffd")


@pytest.mark.parametrize("end", [1, 262], ids=["eos", "end_of_turn"])
def test_generation_ends_on_generation_configs_ids(server, end):
    """<eos> ends an answer only because generation_config.json says so (<end_of_turn> is
    known by name too): forced first, it ends the answer before any text."""
    r = server.post_ok("/v1/chat/completions",
                       {"messages": CONVERSATIONS[0], "max_tokens": 4,
                        "logit_bias": {str(end): 100}})
    choice = r["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == ""


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL = r'\[get_weather\(city="Paris"\)\]'  # a regex forcing the model to call


def test_tools_in_the_list_form(server):
    """Gemma 3's template has no tools (it would leave them out, and the model would never see
    them): the server writes the functions into the first user turn and asks for calls as a
    Python list, which it reads back as tool calls - whole or streamed; earlier calls and
    results are written back the same way. An assistant's calls in a request without tools
    are refused."""
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    st, _, p = server.post("/apply-template", {"messages": msgs, "tools": TOOLS})
    assert st == 200 and '"name": "get_weather"' in p["prompt"] and "Python list" in p["prompt"]
    body = {"messages": msgs, "tools": TOOLS, "max_tokens": 40, "temperature": 0,
            "guided_regex": CALL}
    st, _, r = server.post("/v1/chat/completions", body)
    assert st == 200, r
    c = r["choices"][0]
    assert c["finish_reason"] == "tool_calls" and c["message"]["content"] is None, c
    call = c["message"]["tool_calls"][0]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city":"Paris"}'}
    st, _, data = server.request("POST", "/v1/chat/completions", dict(body, stream=True))
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in data.decode().splitlines()
              if line.startswith("data: {")]
    streamed = [t for d in deltas for t in d.get("tool_calls", [])]
    assert [t["function"] for t in streamed] == [call["function"]]
    assert not any(d.get("content") for d in deltas)
    # the call and its result go back into the conversation, in the same form
    follow = msgs + [c["message"], {"role": "tool", "tool_call_id": call["id"], "content": "sun"}]
    st, _, p = server.post("/apply-template", {"messages": follow, "tools": TOOLS})
    assert st == 200 and '[get_weather(city="Paris")]' in p["prompt"], p
    assert "tool_output\nsun\n" in p["prompt"]
    st, _, r = server.post("/v1/chat/completions", {"messages": follow, "tools": TOOLS,
                                                    "max_tokens": 2})
    assert st == 200, r
    # without tools the answer is text as before, and a reply that is no list stays content
    st, _, r = server.post("/v1/chat/completions", dict(body, guided_regex=r"Sunny, probably\."))
    assert st == 200 and r["choices"][0]["message"]["content"] == "Sunny, probably.", r
    st, _, e = server.post("/v1/chat/completions", {"messages": follow, "max_tokens": 2})
    assert st == 400 and e["error"]["param"] == "messages[1].tool_calls", e
    # the Messages API's tools likewise: offered in the list form
    mtools = [{"name": "get_weather", "input_schema": {"type": "object"}}]
    st, _, m = server.post("/v1/messages", {"max_tokens": 2, "messages": msgs, "tools": mtools})
    assert st == 200 and m["usage"]["input_tokens"] > 60, m


@pytest.mark.parametrize("seed", range(4))
def test_forced_calls_in_the_list_form(server, seed):
    """tool_choice "required" for a model whose calls are a Python list: a grammar of that
    list (text/tool_grammar_py.c) makes the answer calls of the offered functions, with
    arguments valid against their schemas, whatever the model would have written."""
    msgs = [{"role": "user", "content": f"weather? {seed}"}]
    st, _, r = server.post("/v1/chat/completions", {
        "messages": msgs, "tools": FORCED, "tool_choice": "required", "max_tokens": 300,
        "temperature": 1.0, "seed": seed})
    assert st == 200, r
    c = r["choices"][0]
    assert c["finish_reason"] == "tool_calls" and c["message"]["content"] is None, c
    check_calls(c["message"]["tool_calls"])


def test_forced_named_call_in_the_list_form(server):
    """A named function: one call of it (parallel_tool_calls false), whole or streamed; the
    Messages API's tool_choice "any" and "tool" likewise; a tool whose name a Python call
    cannot carry is refused."""
    body = {"messages": [{"role": "user", "content": "now?"}], "tools": FORCED,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": False, "max_tokens": 300, "temperature": 1.0, "seed": 3}
    st, _, r = server.post("/v1/chat/completions", body)
    assert st == 200, r
    calls = r["choices"][0]["message"]["tool_calls"]
    assert len(calls) == 1 and calls[0]["function"]["name"] == "get_weather", calls
    check_calls(calls)
    st, _, data = server.request("POST", "/v1/chat/completions", dict(body, stream=True))
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in data.decode().splitlines()
              if line.startswith("data: {")]
    streamed = [t for d in deltas for t in d.get("tool_calls", [])]
    assert [t["function"] for t in streamed] == [calls[0]["function"]]
    mtools = [{"name": f["function"]["name"], "input_schema": f["function"]["parameters"]}
              for f in FORCED]
    # one call each (a random model may go on adding calls to the list up to max_tokens)
    for choice in ({"type": "any", "disable_parallel_tool_use": True},
                   {"type": "tool", "name": "now", "disable_parallel_tool_use": True}):
        st, _, m = server.post("/v1/messages", {"max_tokens": 300, "messages": body["messages"],
                                                "tools": mtools, "tool_choice": choice})
        assert st == 200 and m["stop_reason"] == "tool_use", m
        uses = [b for b in m["content"] if b["type"] == "tool_use"]
        assert uses and all(b["name"] in ("get_weather", "now") for b in uses), m
        if choice["type"] == "tool":
            assert [(b["name"], b["input"]) for b in uses] == [("now", {})], uses
    bad = [{"type": "function", "function": {"name": "get weather"}}]
    st, _, e = server.post("/v1/chat/completions", dict(body, tools=bad, tool_choice="required"))
    assert st == 400 and e["error"]["param"] == "tools" and "get weather" in \
        e["error"]["message"], e


def test_a_grammar_answer_ends_whole(server):
    """An answer that a grammar ends (its text complete) keeps the bytes of its last tokens:
    SentencePiece's byte fallback holds a run of byte tokens until the next token, and there
    is none. The JSON answer must parse."""
    st, _, r = server.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "JSON please"}], "max_tokens": 60,
        "temperature": 0, "response_format": {"type": "json_object"}})
    assert st == 200 and r["choices"][0]["finish_reason"] == "stop", r
    assert isinstance(json.loads(r["choices"][0]["message"]["content"]), dict)
