"""Images in chat requests: a data: URL image_url part reaches the model's vision tower (a tiny
random Qwen3.5 with one, `tessera synth --preset tiny-vl`), takes the tokens its plan says,
changes the answer, and is told apart from another image of the same size by prefix reuse
(the image tokens are the same ids; the cache compares keys made from the pixels). A
follow-up turn reuses the image's state and answers as a server without the cache does. Bad
images are 400s that leave the server running."""
import base64
import json
import os
import shutil
import subprocess
import time
import zlib

import pytest

from server_util import Server, binary, fixtures, png, png_file, tiny_model

TINY_VL_IMAGE_TOKENS = 1012


def data_url(data, kind="image/png"):
    return f"data:{kind};base64," + base64.b64encode(data).decode()


STRIPES = png(64, 64, lambda x, y: (255 * (x // 8 % 2), 40, 200))
DOTS = png(64, 64, lambda x, y: (30, 255 * ((x * y) % 7 == 0), 90))


def tiny_vl_model():
    """tiny-vl beside the other test models, with the small tokenizer (its vision ids are the
    tower's)."""
    base = os.path.dirname(tiny_model())
    path = os.path.join(base, "serve-tiny-vl")
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
        tmp = path + f".tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([binary(), "synth", "--preset", "tiny-vl", "-o", tmp], check=True,
                       capture_output=True)
        shutil.copy(os.path.join(fixtures(), "tokenizer", "small", "tokenizer.json"), tmp)
        try:
            os.rename(tmp, path)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return path


@pytest.fixture(scope="module")
def warm():
    with Server(model=tiny_vl_model()) as s:
        yield s


@pytest.fixture(scope="module")
def cold():
    with Server("--cache-mb", "0", model=tiny_vl_model()) as s:
        yield s


def ask(image, text="What is in the picture?", **kw):
    body = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(image)}},
        {"type": "text", "text": text}]}],
        "temperature": 0, "max_tokens": 8, "return_token_ids": True, "logprobs": True}
    body.update(kw)
    return body


def test_image_takes_its_planned_tokens(warm):
    # 64x64 is under the model's 65536-pixel minimum: scaled up to 256x256, 16x16 patches of
    # 16 pixels, merged 2x2: 64 image tokens
    st, _, r = warm.post("/v1/chat/completions", ask(STRIPES))
    assert st == 200, r
    st, _, t = warm.post("/v1/chat/completions", ask(STRIPES, text="x"))
    st2, _, plain = warm.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "x"}], "temperature": 0, "max_tokens": 1})
    # the image adds its 64 tokens and vision_start / vision_end
    assert t["usage"]["prompt_tokens"] - plain["usage"]["prompt_tokens"] == 64 + 2


def test_the_image_changes_the_answer(warm):
    st, _, a = warm.post("/v1/chat/completions", ask(STRIPES))
    st, _, b = warm.post("/v1/chat/completions", ask(DOTS))
    la = a["choices"][0]["logprobs"]["content"][0]["logprob"]
    lb = b["choices"][0]["logprobs"]["content"][0]["logprob"]
    assert (a["choices"][0]["token_ids"], la) != (b["choices"][0]["token_ids"], lb)


def test_cache_tells_images_of_one_size_apart(warm, cold):
    """Two images of one size are the same token ids: a cache keyed by ids alone would answer
    the second from the first one's state. Keyed by the pixels, the second reuses only the
    text before its image, and answers as a server without the cache does."""
    body_a = ask(STRIPES, text="describe")
    body_b = ask(DOTS, text="describe")
    st, _, a = warm.post("/v1/chat/completions", body_a)
    assert st == 200
    st, _, b = warm.post("/v1/chat/completions", body_b)
    assert st == 200
    cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached < 10, cached  # at most the turn's opening, never into the image
    st, _, c = cold.post("/v1/chat/completions", body_b)
    assert b["choices"][0]["token_ids"] == c["choices"][0]["token_ids"]
    assert b["choices"][0]["logprobs"] == c["choices"][0]["logprobs"]
    # and the first image again is restored whole
    st, _, a2 = warm.post("/v1/chat/completions", body_a)
    assert a2["usage"]["prompt_tokens_details"]["cached_tokens"] == a2["usage"]["prompt_tokens"]
    assert a2["choices"][0]["token_ids"] == a["choices"][0]["token_ids"]


def ready_turns(srv):
    return srv.metrics()["tessera_next_turn_ready_total"]


def test_follow_up_turn_reuses_the_image(warm, cold):
    turn1 = ask(DOTS, text="first look")
    warm.settle()
    before = ready_turns(warm)
    st, _, r1 = warm.post("/v1/chat/completions", turn1)
    assert st == 200
    # the next turn's prefix is prepared while the client reads the answer
    deadline = time.time() + 10
    while ready_turns(warm) == before and time.time() < deadline:
        time.sleep(0.01)
    assert ready_turns(warm) > before
    msgs = turn1["messages"] + [
        {"role": "assistant", "content": r1["choices"][0]["message"]["content"]},
        {"role": "user", "content": "and now?"}]
    body = dict(turn1, messages=msgs)
    st, _, r2 = warm.post("/v1/chat/completions", body)
    assert st == 200
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] > 64
    st, _, c2 = cold.post("/v1/chat/completions", body)
    assert r2["choices"][0]["token_ids"] == c2["choices"][0]["token_ids"]


def test_two_images_in_order(warm, cold):
    body = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "compare"},
        {"type": "image_url", "image_url": {"url": data_url(STRIPES)}},
        {"type": "text", "text": "with"},
        {"type": "image_url", "image_url": {"url": data_url(DOTS)}}]}],
        "temperature": 0, "max_tokens": 6, "return_token_ids": True}
    st, _, r = warm.post("/v1/chat/completions", body)
    assert st == 200, r
    swapped = {"messages": [{"role": "user", "content": [
        body["messages"][0]["content"][i] for i in (0, 3, 2, 1)]}],
        "temperature": 0, "max_tokens": 6, "return_token_ids": True}
    st, _, s = cold.post("/v1/chat/completions", swapped)
    st, _, c = cold.post("/v1/chat/completions", body)
    assert r["choices"][0]["token_ids"] == c["choices"][0]["token_ids"]
    assert r["usage"]["prompt_tokens"] == s["usage"]["prompt_tokens"]


def test_truncation_auto_drops_the_images_of_the_turns_it_drops(warm):
    """The Responses API's truncation "auto" drops the oldest turns with their images: a
    conversation whose first turn holds one image and whose last holds another, on a server
    whose context fits only the last, is answered as the last turn alone is (the same prompt
    length and log-probabilities: its own image kept, not the first one)."""
    def img(picture):
        return {"type": "input_image", "image_url": data_url(picture)}
    first = [{"role": "user", "content": [{"type": "input_text", "text": "first"}, img(STRIPES)]},
             {"role": "assistant", "content": "a striped one"}]
    last = [{"role": "user", "content": [{"type": "input_text", "text": "and this?"}, img(DOTS)]}]
    body = {"temperature": 0, "max_output_tokens": 4, "top_logprobs": 2,
            "include": ["message.output_text.logprobs"]}
    st, _, want = warm.post("/v1/responses", dict(body, input=last))
    assert st == 200, want
    st, _, other = warm.post("/v1/responses", dict(body, input=[
        dict(last[0], content=[last[0]["content"][0], img(STRIPES)])]))
    lps = [m["content"][0]["logprobs"] for r in (want, other)
           for m in r["output"] if m["type"] == "message"]
    assert lps[0] != lps[1]  # which image is kept shows
    n = want["usage"]["input_tokens"]
    with Server("--ctx", str(n + 4), model=tiny_vl_model()) as s:
        st, _, e = s.post("/v1/responses", dict(body, input=first + last))
        assert st == 400 and e["error"]["code"] == "context_length_exceeded", e
        st, _, r = s.post("/v1/responses", dict(body, input=first + last, truncation="auto"))
        assert st == 200, r
        assert r["usage"]["input_tokens"] == n
        got = [m["content"][0]["logprobs"] for m in r["output"] if m["type"] == "message"]
        assert got == lps[:1]


def test_streaming_with_an_image(warm):
    client = warm.client()
    body = ask(STRIPES)
    stream = client.chat.completions.create(model="serve-tiny-vl", messages=body["messages"],
                                            temperature=0,
                                            max_tokens=8, stream=True)
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    st, _, r = warm.post("/v1/chat/completions", ask(STRIPES))
    assert text == r["choices"][0]["message"]["content"]


def test_large_image_is_scaled_to_the_pixel_bound():
    with Server("--image-max-pixels", "65536", model=tiny_vl_model()) as s:
        big = png(600, 300, lambda x, y: (x % 256, y % 256, 7))
        st, _, r = s.post("/v1/chat/completions", ask(big, text="x", max_tokens=1))
        assert st == 200, r
        st, _, plain = s.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "x"}], "temperature": 0, "max_tokens": 1})
        n_image = r["usage"]["prompt_tokens"] - plain["usage"]["prompt_tokens"] - 2
        # 600x300 within 65536 pixels: 352x160 -> 22x10 patches -> 55 tokens
        assert n_image == 55, n_image


BAD = [
    (data_url(b"not an image at all"), "invalid_value"),
    (data_url(STRIPES[:60]), "invalid_value"),  # truncated
    ("data:image/png;base64,@@@@", "invalid_value"),
    ("data:image/png,rawbytes", "invalid_value"),
    ("https://example.com/cat.png", "invalid_value"),
    (data_url(png(1, 300, lambda x, y: (0, 0, 0))), "invalid_value"),  # aspect ratio 300
]


@pytest.mark.parametrize("url,code", BAD)
def test_bad_images_are_400(warm, url, code):
    body = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "x"}]}],
        "max_tokens": 1}
    st, _, r = warm.post("/v1/chat/completions", body)
    assert st == 400, r
    assert r["error"]["code"] == code
    assert r["error"]["param"] == "messages[0].content[0]"
    st, _, ok = warm.post("/v1/chat/completions", ask(STRIPES, max_tokens=1))
    assert st == 200


def test_too_many_images(warm):
    parts = [{"type": "image_url", "image_url": {"url": data_url(STRIPES)}}] * 17
    st, _, r = warm.post("/v1/chat/completions",
                         {"messages": [{"role": "user", "content": parts}], "max_tokens": 1})
    assert st == 400 and r["error"]["code"] == "invalid_value"
    assert "at most 16" in r["error"]["message"]


def test_image_in_system_message_is_refused(warm):
    body = {"messages": [{"role": "system", "content": [
        {"type": "image_url", "image_url": {"url": data_url(STRIPES)}}]},
        {"role": "user", "content": "x"}], "max_tokens": 1}
    st, _, r = warm.post("/v1/chat/completions", body)
    assert st == 400 and r["error"]["code"] == "invalid_value", r


def test_text_model_refuses_images():
    with Server() as s:
        st, _, r = s.post("/v1/chat/completions", ask(STRIPES))
        assert st == 400
        assert r["error"]["code"] == "unsupported_feature"
        assert "takes no images" in r["error"]["message"]


def test_tokenize_counts_the_image(warm):
    body = ask(STRIPES, text="x")
    st, _, t = warm.post("/tokenize", {"messages": body["messages"]})
    assert st == 200, t
    assert t["tokens"].count(TINY_VL_IMAGE_TOKENS) == 64
    st, _, r = warm.post("/v1/chat/completions", dict(body, max_tokens=1))
    assert t["count"] == r["usage"]["prompt_tokens"]


def test_props_and_template_show_the_images(warm):
    """/props says the model reads images and videos; /apply-template writes an image as the
    tokens its plan takes, as /tokenize counts them."""
    st, _, p = warm.request("GET", "/props")
    assert st == 200 and json.loads(p)["modalities"] == {"vision": True, "video": True,
                                                         "audio": False}
    body = ask(STRIPES, text="x")
    st, _, r = warm.post("/apply-template", {"messages": body["messages"]})
    assert st == 200, r
    assert "<|vision_start|>" + "<|image_pad|>" * 64 + "<|vision_end|>x" in r["prompt"], r


def two_images_turn(tmp_path, **extra):
    """One chat turn with the two test images and a question, greedy for 6 tokens: its request
    body, and the arguments that give `tessera run` the same turn (the images as files)."""
    (tmp_path / "a.png").write_bytes(STRIPES)
    (tmp_path / "b.png").write_bytes(DOTS)
    body = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(STRIPES)}},
        {"type": "image_url", "image_url": {"url": data_url(DOTS)}},
        {"type": "text", "text": "compare them"}]}],
        "temperature": 0, "max_tokens": 6, "return_token_ids": True, "ignore_eos": True, **extra}
    cli = ["run", "-m", tiny_vl_model(), "--image", str(tmp_path / "a.png"), "--image",
           str(tmp_path / "b.png"), "-p", "compare them", "-n", "6", "--print-ids", "--ignore-eos"]
    return body, cli


def test_two_images_as_the_cli_reads_them(warm, tmp_path):
    """The server encodes a request's images one a step (other lanes decode between them) into
    one buffer of rows: its answer is the one `tessera run` gives for the same turn, which
    encodes them in one go."""
    body, cli = two_images_turn(tmp_path)
    st, _, r = warm.post("/v1/chat/completions", body)
    assert st == 200, r
    out = subprocess.run([binary(), *cli, "--threads", "1"], capture_output=True, check=True,
                         text=True)
    assert [int(t) for t in out.stdout.split()] == r["choices"][0]["token_ids"]


def solid_png(width, height, rgb=(10, 200, 30)):
    """A PNG of one colour, streamed row by row into the compressor: a 5000x5000 one is ~84 KB
    and ~75 MB once decoded."""
    row = b"\0" + bytes(rgb) * width
    z = zlib.compressobj(9)
    return png_file(width, height, b"".join(z.compress(row) for _ in range(height)) + z.flush())


def test_large_images_at_once_stay_within_memory():
    """Small files that decode to large images: a few are decoded at a time, and a job keeps
    its image at the size the tower takes, not the file's (eight 5000x5000 requests at once took
    the server's peak memory up by ~620 MB before, ~200 MB now)."""
    import threading
    body = ask(solid_png(5000, 5000), max_tokens=4)
    with Server("--debug-step-delay-ms", "100", "--max-pending", "8",
                model=tiny_vl_model()) as s:
        def peak_mb():
            with open(f"/proc/{s.proc.pid}/status") as f:
                return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:")) / 1024
        before = peak_mb()
        answers = []

        def send():
            st, _, r = s.post("/v1/chat/completions", body, timeout=300)
            answers.append((st, r))

        threads = [threading.Thread(target=send) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [st for st, _ in answers] == [200] * 8, answers[0][1]
        if not os.environ.get("TS_SERVER_BIN"):  # a sanitizer's allocator keeps freed memory
            grown = peak_mb() - before
            assert grown < 400, f"peak memory grew {grown:.0f} MB"


def test_messages_images_and_tool_results(warm):
    """Anthropic's Messages API with a vision model: an image block of a user message, and an
    image among a tool_result's blocks (a tool that read a picture), answer as the chat
    request they mean - the image, and the text before and after it, in a tool message."""
    src = {"type": "base64", "media_type": "image/png",
           "data": base64.b64encode(DOTS).decode()}
    msgs = [{"role": "user", "content": [{"type": "image", "source": src},
                                         {"type": "text", "text": "Open it."}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read",
                                               "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "text", "text": "the file:"}, {"type": "image", "source": src},
                {"type": "text", "text": "(64x64)"}]}]}]
    st, _, m = warm.post("/v1/messages", {"max_tokens": 4, "temperature": 0, "messages": msgs})
    assert st == 200, m
    part = {"type": "image_url", "image_url": {"url": data_url(DOTS)}}
    chat = [{"role": "user", "content": [part, {"type": "text", "text": "Open it."}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "t1", "content": [
                {"type": "text", "text": "the file:"}, part, {"type": "text", "text": "(64x64)"}]}]
    st, _, c = warm.post("/v1/chat/completions", {"max_tokens": 4, "temperature": 0,
                                                  "messages": chat})
    assert st == 200, c
    assert m["usage"]["input_tokens"] == c["usage"]["prompt_tokens"] > 2 * 64
    assert m["content"][0]["text"] == c["choices"][0]["message"]["content"]
    # a block the tool_result cannot hold is named
    msgs[2]["content"][0]["content"].append({"type": "document", "source": src})
    st, _, e = warm.post("/v1/messages", {"max_tokens": 4, "messages": msgs})
    assert st == 400 and "messages[2].content.0.content.3" in e["error"]["message"], e
