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
    for text in TEXTS:
        want = hf(text)["input_ids"]
        assert want[0] == 2  # the post-processor's <bos>
        assert server.post_ok("/tokenize", {"content": text})["tokens"] == want, text


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


def test_tools_are_refused_not_dropped(server):
    """Gemma 3's chat format has no tools: its template leaves them (and an assistant's tool
    calls) out, so a model served with them would never see them. They are a 400, on chat,
    /tokenize, the Responses API and the Messages API; an empty list of tools is none."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    for path in ("/v1/chat/completions", "/tokenize"):
        st, _, e = server.post(path, {"messages": msgs, "tools": tools, "max_tokens": 2})
        assert st == 400 and e["error"]["code"] == "unsupported_feature", e
        assert e["error"]["param"] == "tools" and "no tools" in e["error"]["message"]
    st, _, r = server.post("/v1/chat/completions", {"messages": msgs, "tools": [], "max_tokens": 2})
    assert st == 200, r
    called = msgs + [{"role": "assistant", "content": "ok", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "user", "content": "and?"}]
    st, _, e = server.post("/v1/chat/completions", {"messages": called, "max_tokens": 2})
    assert st == 400 and e["error"]["param"] == "messages[1].tool_calls", e
    st, _, e = server.post("/v1/responses", {"input": "Weather?", "max_output_tokens": 2,
                                             "tools": [{"type": "function", "name": "f",
                                                        "parameters": {"type": "object"}}]})
    assert st == 400 and e["error"]["param"] == "tools", e
    st, _, e = server.post("/v1/messages", {"max_tokens": 2, "messages": msgs, "tools": [
        {"name": "f", "input_schema": {"type": "object"}}]})
    assert st == 400 and "no tools" in e["error"]["message"], e
