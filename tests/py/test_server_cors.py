"""CORS, so that a web page can call the server from a browser (as llama-server and vLLM allow by
default): every answer carries Access-Control-Allow-Origin, and a preflight (OPTIONS) is answered
before the API key is looked at, since browsers send it without credentials. --cors-origins
narrows the pages to a list, or turns CORS off."""
import json

from server_util import Server, chat

PAGE = {"Origin": "http://page.example"}
PREFLIGHT = {"Origin": "http://page.example", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}


def test_any_page_by_default():
    with Server("--api-key", "k") as s:
        status, hd, _ = s.request("OPTIONS", "/v1/chat/completions", headers=PREFLIGHT)
        assert status == 204
        assert hd["access-control-allow-origin"] == "*"
        assert "POST" in hd["access-control-allow-methods"]
        assert hd["access-control-allow-headers"] == "authorization, content-type"
        auth = {"Authorization": "Bearer k", **PAGE}
        status, hd, _ = s.request("POST", "/v1/chat/completions", chat("hi", max_tokens=2),
                                  headers=auth)
        assert status == 200 and hd["access-control-allow-origin"] == "*"
        # errors too (the page can read why), streams, the GET routes
        status, hd, _ = s.request("POST", "/v1/chat/completions", chat("hi"), headers=PAGE)
        assert status == 401 and hd["access-control-allow-origin"] == "*"
        status, hd, data = s.request("POST", "/v1/chat/completions",
                                     chat("hi", max_tokens=2, stream=True), headers=auth)
        assert status == 200 and hd["access-control-allow-origin"] == "*"
        assert data.decode().rstrip().endswith("data: [DONE]")
        for path in ("/v1/models", "/metrics", "/health"):
            status, hd, _ = s.request("GET", path, headers=auth)
            assert status == 200 and hd["access-control-allow-origin"] == "*", path
        # a preflight of an unknown route is still a 404
        assert s.request("OPTIONS", "/nowhere", headers=PREFLIGHT)[0] == 404


def test_a_list_of_origins():
    with Server("--cors-origins", "http://a.example, http://page.example") as s:
        status, hd, _ = s.request("OPTIONS", "/v1/completions", headers=PREFLIGHT)
        assert status == 204 and hd["access-control-allow-origin"] == "http://page.example"
        assert hd["vary"] == "Origin"
        other = {"Origin": "http://evil.example"}
        status, hd, body = s.request("POST", "/v1/completions",
                                     {"prompt": "x", "max_tokens": 1}, headers=other)
        assert status == 200 and "access-control-allow-origin" not in hd
        status, hd, _ = s.request("OPTIONS", "/v1/completions",
                                  headers=dict(PREFLIGHT, Origin="http://evil.example"))
        assert status == 204 and "access-control-allow-origin" not in hd
        assert "access-control-allow-methods" not in hd


def test_off():
    with Server("--cors-origins", "") as s:
        status, hd, _ = s.request("OPTIONS", "/v1/completions", headers=PREFLIGHT)
        assert status == 204 and "access-control-allow-origin" not in hd
        assert hd["allow"] == "POST, OPTIONS"
        status, hd, body = s.request("GET", "/v1/models", headers=PAGE)
        assert status == 200 and "access-control-allow-origin" not in hd
        assert json.loads(body)["data"]
