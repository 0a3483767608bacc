"""Videos in chat requests: a data: URL video_url part (vLLM's form) is decoded, its frames
sampled and cut into steps as Hugging Face's Qwen3-VL processor does, each step written into
the prompt as "<S seconds>" and its video tokens, encoded by the vision tower, and the answer
depends on it. The tiny model is test_server_vision's (`tessera synth --preset tiny-vl`, no
video_preprocessor_config.json: the Qwen3-VL video processor's defaults). The exact arithmetic
against Hugging Face is tests/unit/test_video_model.c's; decoding against PyAV is
tests/unit/test_video.c's. Bad videos and settings are 400s that leave the server running."""
import base64
import os

import pytest

from server_util import Server, fixtures, tiny_model
from test_server_vision import STRIPES, tiny_vl_model
from test_server_vision import data_url as vision_url

VIDEO_START, VIDEO_END, VIDEO_PAD = 1009, 1010, 1013


def video(name):
    with open(os.path.join(fixtures(), "video", name), "rb") as f:
        return f.read()


def data_url(data, kind="video/mp4"):
    return f"data:{kind};base64," + base64.b64encode(data).decode()


MP4 = video("h264_bframes.mp4")  # 48x32, 12 frames at 10 a second
WEBM = video("vp9.webm")


def ask(data, text="What happens?", kind="video/mp4", **kw):
    body = {"messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": data_url(data, kind)}},
        {"type": "text", "text": text}]}],
        "temperature": 0, "max_tokens": 6, "return_token_ids": True, "logprobs": True}
    body.update(kw)
    return body


@pytest.fixture(scope="module")
def warm():
    with Server(model=tiny_vl_model()) as s:
        yield s


@pytest.fixture(scope="module")
def cold():
    with Server("--cache-mb", "0", model=tiny_vl_model()) as s:
        yield s


def tokenize(srv, body):
    req = {"messages": body["messages"], "add_generation_prompt": True}
    if "mm_processor_kwargs" in body:
        req["mm_processor_kwargs"] = body["mm_processor_kwargs"]
    st, _, r = srv.post("/tokenize", req)
    assert st == 200, r
    return r["tokens"]


def detok(srv, ids):
    st, _, r = srv.post("/detokenize", {"tokens": ids})
    assert st == 200, r
    return r["content"]


def test_video_takes_its_planned_steps(warm):
    # 12 frames at 10 a second, 2 sampled a second: int(12 / 10 * 2) = 2, raised to the
    # minimum of 4: frames 0, 4, 7, 11 (np.linspace(0, 11, 4).round()), two steps of two at
    # (0 + 0.4) / 2 = 0.2 and (0.7 + 1.1) / 2 = 0.9 seconds. 4 x 32 x 48 pixels is under the
    # default 131072: scaled by sqrt(131072 / 6144) to 160 x 224, 10 x 14 patches of 16, merged
    # 2 x 2: 35 tokens a step
    ids = tokenize(warm, ask(MP4))
    assert ids.count(VIDEO_START) == 2 and ids.count(VIDEO_END) == 2
    assert ids.count(VIDEO_PAD) == 70
    text = detok(warm, ids)
    assert "<0.2 seconds><|vision_start|>" in text
    assert "<|vision_end|><0.9 seconds><|vision_start|>" in text
    # the chat usage counts what /tokenize counts
    st, _, r = warm.post("/v1/chat/completions", ask(MP4))
    assert st == 200, r
    assert r["usage"]["prompt_tokens"] == len(ids)


def test_fps_from_mm_processor_kwargs(warm):
    # 10 a second: all 12 frames, six steps; 12 x 32 x 48 scaled by sqrt(131072 / 18432) to
    # 96 x 128: 6 x 8 patches, 12 tokens a step
    body = ask(MP4, mm_processor_kwargs={"fps": 10})
    ids = tokenize(warm, body)
    assert ids.count(VIDEO_START) == 6 and ids.count(VIDEO_PAD) == 72
    # steps at 0.05, 0.25, 0.45, 0.65, 0.85, 1.05 seconds as binary fractions print them
    text = detok(warm, ids)
    assert all(f"<{s} seconds>" in text for s in ("0.1", "0.2", "0.5", "0.6", "0.9", "1.1"))
    st, _, r = warm.post("/v1/chat/completions", body)
    assert st == 200, r
    assert r["usage"]["prompt_tokens"] == len(ids)


def test_the_video_changes_the_answer(warm):
    st, _, a = warm.post("/v1/chat/completions", ask(MP4))
    st2, _, b = warm.post("/v1/chat/completions", ask(WEBM, kind="video/webm"))
    assert st == 200 and st2 == 200, (a, b)
    la = a["choices"][0]["logprobs"]["content"][0]["logprob"]
    lb = b["choices"][0]["logprobs"]["content"][0]["logprob"]
    assert (a["choices"][0]["token_ids"], la) != (b["choices"][0]["token_ids"], lb)


def test_cache_and_cold_server_agree(warm, cold):
    body = ask(MP4, text="again")
    st, _, a = warm.post("/v1/chat/completions", body)
    st, _, a2 = warm.post("/v1/chat/completions", body)
    assert a2["usage"]["prompt_tokens_details"]["cached_tokens"] == a2["usage"]["prompt_tokens"]
    st, _, c = cold.post("/v1/chat/completions", body)
    assert a["choices"][0]["token_ids"] == c["choices"][0]["token_ids"] == \
        a2["choices"][0]["token_ids"]
    assert a["choices"][0]["logprobs"] == c["choices"][0]["logprobs"]
    # another video of other frames: nothing of the first one's steps is reused
    st, _, b = warm.post("/v1/chat/completions", ask(WEBM, text="again", kind="video/webm"))
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] < 10


def test_follow_up_turn_reuses_the_video(cold):
    """The next turn's prefix, keyed by the steps' pixels, is prepared while the client reads
    the answer: the follow-up restores the video's state instead of running the tower again.
    (A server of its own: the shared one may still be deciding other answers' next turns.)"""
    turn1 = ask(MP4, text="first look")
    with Server(model=tiny_vl_model()) as s:
        before = s.next_turns()
        st, _, r1 = s.post("/v1/chat/completions", turn1)
        assert st == 200, r1
        s.wait_next_turn(before)
        msgs = turn1["messages"] + [
            {"role": "assistant", "content": r1["choices"][0]["message"]["content"]},
            {"role": "user", "content": "and now?"}]
        body = dict(turn1, messages=msgs)
        st, _, r2 = s.post("/v1/chat/completions", body)
        assert st == 200, r2
        assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] > 70
    st, _, c2 = cold.post("/v1/chat/completions", body)
    assert r2["choices"][0]["token_ids"] == c2["choices"][0]["token_ids"]


def test_image_and_video_in_one_message(warm, cold):
    png = "data:image/png;base64," + base64.b64encode(STRIPES).decode()
    body = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": png}},
        {"type": "text", "text": "then"},
        {"type": "video_url", "video_url": {"url": data_url(MP4)}}]}],
        "temperature": 0, "max_tokens": 4, "return_token_ids": True}
    st, _, r = warm.post("/v1/chat/completions", body)
    assert st == 200, r
    st, _, c = cold.post("/v1/chat/completions", body)
    assert r["choices"][0]["token_ids"] == c["choices"][0]["token_ids"]
    ids = tokenize(warm, body)
    assert ids.count(1012) == 64 and ids.count(VIDEO_PAD) == 70


BAD = [
    (data_url(b"not a video at all"), "invalid_value"),
    (data_url(MP4[:200]), "invalid_value"),  # truncated
    ("data:video/mp4;base64,@@@@", "invalid_value"),
    ("data:video/mp4,rawbytes", "invalid_value"),
    ("https://example.com/clip.mp4", "invalid_value"),
    (data_url(STRIPES, "image/png"), "invalid_value"),  # an image is not a video
    (data_url(b"#EXTM3U\n#EXTINF:1,\nfile:///etc/passwd\n"), "invalid_value"),
]


@pytest.mark.parametrize("url,code", BAD)
def test_bad_video_is_refused(warm, url, code):
    body = {"messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": url}}]}], "max_tokens": 2}
    st, _, r = warm.post("/v1/chat/completions", body)
    assert st == 400, r
    assert r["error"]["code"] == code, r
    assert r["error"]["param"] == "messages[0].content[0]", r
    st, _, _ = warm.request("GET", "/health")
    assert st == 200


@pytest.mark.parametrize("kw,code", [
    ({"num_frames": 4}, "unsupported_feature"),
    ({"fps": 0}, "invalid_value"),
    ({"fps": "2"}, "invalid_value"),
    ("fps", "invalid_value"),
])
def test_bad_processor_kwargs(warm, kw, code):
    st, _, r = warm.post("/v1/chat/completions", ask(MP4, mm_processor_kwargs=kw))
    assert st == 400, r
    assert r["error"]["code"] == code, r


def test_a_video_processor_it_cannot_follow_refuses_videos_only(tmp_path):
    """A checkpoint whose video_preprocessor_config.json samples frames otherwise than by fps
    still loads: the server says at start why it refuses videos, refuses each with that
    reason, and answers text and images."""
    src = tiny_vl_model()
    for name in os.listdir(src):
        os.symlink(os.path.join(src, name), tmp_path / name)
    (tmp_path / "video_preprocessor_config.json").write_text('{"do_sample_frames": false}')
    with Server(model=str(tmp_path)) as s:
        assert "videos are refused: video_preprocessor_config.json: frames sampled" in s.stderr()
        st, _, r = s.post("/v1/chat/completions", ask(MP4))
        assert st == 400, r
        assert r["error"]["code"] == "unsupported_feature", r
        assert "takes no videos: video_preprocessor_config.json: " in r["error"]["message"], r
        assert "do_sample_frames false" in r["error"]["message"], r
        image = {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": vision_url(STRIPES)}},
            {"type": "text", "text": "What is it?"}]}], "max_tokens": 2}
        st, _, r = s.post("/v1/chat/completions", image)
        assert st == 200 and r["usage"]["prompt_tokens"] > 20, r


def test_a_model_without_a_tower_refuses_videos():
    with Server(model=tiny_model()) as s:
        st, _, r = s.post("/v1/chat/completions", ask(MP4))
        assert st == 400, r
        assert r["error"]["code"] == "unsupported_feature", r
        assert "videos" in r["error"]["message"], r
