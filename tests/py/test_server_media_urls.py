"""Images by URL. http(s) (--allow-media-urls): fetched from a local HTTP server this test runs,
an image at a URL is answered exactly as the same file inline; redirects are followed between
http URLs only; a missing file, a redirect to another scheme, a file over --media-url-max-mb,
a transfer over --media-url-timeout and an unreachable host are 400s naming the part, and the
server goes on. Without the flag, a URL is a 400 that says how to send the file. file:
(--allowed-media-dir): read from under the directory only, links followed before the check."""
import http.server
import subprocess
import threading
import time

import pytest

from server_util import Server, binary
from test_server_vision import DOTS, STRIPES, data_url, tiny_vl_model


class Files(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/stripes.png":
            self.reply(200, STRIPES)
        elif self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/stripes.png")
            self.end_headers()
        elif self.path == "/loop":
            self.send_response(302)
            self.send_header("Location", "/loop")
            self.end_headers()
        elif self.path == "/away":  # to this server by its address, not by the name asked
            self.send_response(302)
            self.send_header("Location",
                             f"http://127.0.0.1:{self.server.server_address[1]}/stripes.png")
            self.end_headers()
        elif self.path == "/to-file":
            self.send_response(302)
            self.send_header("Location", "file:///etc/hostname")
            self.end_headers()
        elif self.path == "/big.png":
            self.reply(200, STRIPES + b"\0" * (2 << 20))
        elif self.path == "/slow.png":
            time.sleep(3)
            self.reply(200, STRIPES)
        elif self.path.startswith("/lag/"):  # /lag/<n>/x.png: 0.6 s, then DOTS or STRIPES
            time.sleep(0.6)
            self.reply(200, DOTS if self.path.endswith("dots.png") else STRIPES)
        else:
            self.reply(404, b"no such file")

    def reply(self, status, data):
        self.send_response(status)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except OSError:
            pass  # the client gave up (the size and time limits)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def files():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Files)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def srv():
    with Server("--allow-media-urls", "--media-url-max-mb", "1", "--media-url-timeout", "1",
                model=tiny_vl_model()) as s:
        yield s


def ask(url, **kw):
    return dict({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is in the picture?"},
        {"type": "image_url", "image_url": {"url": url}}]}],
        "temperature": 0, "max_tokens": 6, "logprobs": True, "top_logprobs": 2}, **kw)


def answer(r):
    c = r["choices"][0]
    return c["message"]["content"], c["logprobs"], r["usage"]["prompt_tokens"]


def test_image_at_a_url_is_the_image_inline(srv, files):
    st, _, want = srv.post("/v1/chat/completions", ask(data_url(STRIPES)))
    assert st == 200, want
    for path in ("/stripes.png", "/moved"):
        st, _, r = srv.post("/v1/chat/completions", ask(files + path))
        assert st == 200, r
        assert answer(r) == answer(want)
    st, _, other = srv.post("/v1/chat/completions", ask(data_url(DOTS)))
    assert answer(other) != answer(want)  # the image's pixels matter
    # the Responses API's input_image by URL too
    st, _, r = srv.post("/v1/responses", {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What is in the picture?"},
        {"type": "input_image", "image_url": files + "/stripes.png"}]}],
        "temperature": 0, "max_output_tokens": 6})
    assert st == 200, r
    assert r["output"][-1]["content"][0]["text"] == answer(want)[0]


def images(urls):
    return {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": u}} for u in urls] + [
        {"type": "text", "text": "What is in the pictures?"}]}],
        "temperature": 0, "max_tokens": 4, "logprobs": True, "top_logprobs": 2}


def test_a_request_s_urls_are_fetched_at_once(srv, files):
    """Four URLs that each take 0.6 s: the request waits for the slowest, not for the sum (one
    after another they took 2.4 s); the answer is the one to the same images inline, in their
    order; the first part that fails is the one named, whichever finished first."""
    names = ["dots.png", "stripes.png", "stripes.png", "dots.png"]
    urls = [f"{files}/lag/{i}/{n}" for i, n in enumerate(names)]
    st, _, want = srv.post("/v1/chat/completions",
                           images([data_url(DOTS if n == "dots.png" else STRIPES) for n in names]))
    assert st == 200, want
    t0 = time.monotonic()
    st, _, r = srv.post("/v1/chat/completions", images(urls))
    took = time.monotonic() - t0
    assert st == 200, r
    assert answer(r) == answer(want)
    assert took < 1.8, took
    st, _, e = srv.post("/v1/chat/completions",
                        images([urls[0], files + "/slow.png", files + "/missing.png"]))
    assert st == 400 and e["error"]["param"] == "messages[0].content[1]", e
    assert "took longer than 1 s" in e["error"]["message"], e


@pytest.mark.parametrize("path,says", [
    ("/missing.png", "HTTP 404"),
    ("/to-file", "fetching the image failed"),
    ("/big.png", "larger than this server fetches"),
    ("/slow.png", "took longer than 1 s"),
    ("/loop", "more than 5 redirects"),
])
def test_a_url_that_fails_is_400(srv, files, path, says):
    t0 = time.monotonic()
    st, _, e = srv.post("/v1/chat/completions", ask(files + path))
    assert st == 400, e
    assert e["error"]["code"] == "invalid_value"
    assert e["error"]["param"] == "messages[0].content[1]"
    assert says in e["error"]["message"], e
    assert time.monotonic() - t0 < 2.5
    st, _, r = srv.post("/v1/chat/completions", ask(data_url(STRIPES), max_tokens=1))
    assert st == 200, r


def test_other_schemes_and_unreachable_hosts(srv):
    for url in ("ftp://127.0.0.1/x.png", "gopher://127.0.0.1/x.png", "http://127.0.0.1:1/x.png"):
        st, _, e = srv.post("/v1/chat/completions", ask(url))
        assert st == 400 and e["error"]["param"] == "messages[0].content[1]", (url, e)


def test_only_the_allowed_hosts(files):
    """--allowed-media-domains: fetching on, from those hosts only - each redirect's target
    checked before it is fetched; the host compared without regard to case."""
    by_name = files.replace("127.0.0.1", "localhost")
    with Server("--allowed-media-domains", "example.org,LocalHost", model=tiny_vl_model()) as s:
        st, _, want = s.post("/v1/chat/completions", ask(data_url(STRIPES)))
        for url in (by_name + "/stripes.png", by_name + "/moved"):
            st, _, r = s.post("/v1/chat/completions", ask(url))
            assert st == 200 and answer(r) == answer(want), (url, r)
        for url in (files + "/stripes.png", by_name + "/away"):
            st, _, e = s.post("/v1/chat/completions", ask(url))
            assert st == 400 and e["error"]["param"] == "messages[0].content[1]", (url, e)
            assert "'127.0.0.1'" in e["error"]["message"], e
            assert "--allowed-media-domains" in e["error"]["message"], e
    p = subprocess.run([binary(), "serve", "-m", tiny_vl_model(), "--allowed-media-domains", ","],
                       capture_output=True, timeout=30)
    assert p.returncode == 1 and b"allowed-media-domains" in p.stderr


def test_urls_are_refused_unless_allowed(files):
    with Server(model=tiny_vl_model()) as s:
        st, _, e = s.post("/v1/chat/completions", ask(files + "/stripes.png"))
        assert st == 400 and e["error"]["code"] == "invalid_value", e
        assert e["error"]["param"] == "messages[0].content[1]"
        assert "--allow-media-urls" in e["error"]["message"]
        # /tokenize reads the same way
        st, _, e = s.post("/tokenize", ask(files + "/stripes.png"))
        assert st == 400 and "--allow-media-urls" in e["error"]["message"], e


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """A directory the server may read (stripes.png, a file with a space in its name, a link
    out of it, a subdirectory) beside a file it may not."""
    root = tmp_path_factory.mktemp("media")
    inside = root / "allowed"
    (inside / "sub").mkdir(parents=True)
    (inside / "stripes.png").write_bytes(STRIPES)
    (inside / "two words.png").write_bytes(STRIPES)
    (inside / "big.png").write_bytes(STRIPES + b"\0" * (2 << 20))
    (root / "outside.png").write_bytes(STRIPES)
    (inside / "link-out.png").symlink_to(root / "outside.png")
    return inside


def test_local_file_is_the_image_inline(media):
    """--allowed-media-dir: a file: URL under the directory is read (percent-escapes decoded)
    and answered as the same file inline."""
    with Server("--allowed-media-dir", str(media), "--media-url-max-mb", "1",
                model=tiny_vl_model()) as s:
        st, _, want = s.post("/v1/chat/completions", ask(data_url(STRIPES)))
        for url in (f"file://{media}/stripes.png", f"file://{media}/two%20words.png",
                    f"file://localhost{media}/sub/../stripes.png"):
            st, _, r = s.post("/v1/chat/completions", ask(url))
            assert st == 200, (url, r)
            assert answer(r) == answer(want)


@pytest.mark.parametrize("name,says", [
    ("../outside.png", "under the directory"),
    ("link-out.png", "under the directory"),  # a link out of it is outside
    ("missing.png", "under the directory"),
    ("sub", "not a readable file"),
    ("big.png", "larger than this server reads"),
    ("stripes%00.png", "absolute path"),
])
def test_local_file_outside_or_unreadable_is_400(media, name, says):
    with Server("--allowed-media-dir", str(media), "--media-url-max-mb", "1",
                model=tiny_vl_model()) as s:
        st, _, e = s.post("/v1/chat/completions", ask(f"file://{media}/{name}"))
        assert st == 400 and e["error"]["code"] == "invalid_value", e
        assert e["error"]["param"] == "messages[0].content[1]"
        assert says in e["error"]["message"], e
        st, _, r = s.post("/v1/chat/completions", ask(data_url(STRIPES), max_tokens=1))
        assert st == 200, r


def test_local_files_are_refused_without_a_directory(srv, media):
    """No --allowed-media-dir (here a server that fetches http URLs): file: URLs are refused,
    saying how to allow them; a bad directory stops the server at its start."""
    st, _, e = srv.post("/v1/chat/completions", ask(f"file://{media}/stripes.png"))
    assert st == 400 and "--allowed-media-dir" in e["error"]["message"], e
    p = subprocess.run([binary(), "serve", "-m", tiny_vl_model(), "--port", "0",
                        "--allowed-media-dir", str(media / "stripes.png")],
                       capture_output=True, timeout=60)
    assert p.returncode != 0 and b"--allowed-media-dir" in p.stderr, p.stderr
