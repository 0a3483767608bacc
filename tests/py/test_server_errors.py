"""Every error row of specs/serving.md over raw HTTP: status, envelope and code; the fixed
validation order; body and header limits; content type; method; API key; model loading."""
import json
import os
import threading
import time

import pytest

from server_util import Server, chat, raw


@pytest.fixture(scope="module")
def srv():
    with Server("--max-tokens-cap", "1000", "--max-body-kb", "64") as s:
        yield s


def envelope(body):
    e = json.loads(body)["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    assert isinstance(e["message"], str) and e["message"]
    return e


def expect(srv, status, code, method, path, body=None, headers=None, param="-"):
    st, hd, data = srv.request(method, path, body, headers)
    assert st == status, (st, data)
    assert hd["content-type"].startswith("application/json")
    e = envelope(data)
    assert e["code"] == code, e
    if param != "-":
        assert e["param"] == param, e
    return hd, e


U = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.mark.parametrize("body,code,param", [
    ("{not json", "invalid_request_body", None),
    ("[1, 2]", "invalid_request_body", None),
    ("", "invalid_request_body", None),
    ('{"messages": [], "messages": []}', "invalid_request_body", None),
    ("[" * 100 + "]" * 100, "invalid_request_body", None),
    ('{"messages": [{"role": "user", "content": "a\\u0000b"}]}', "invalid_request_body", None),
    ({"messages": "hi"}, "invalid_value", "messages"),
    ({"messages": []}, "invalid_value", "messages"),
    ({}, "invalid_value", "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "invalid_role", "messages[0].role"),
    ({"messages": [{"role": 3, "content": "x"}]}, "invalid_role", "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "invalid_value", "messages[0].content"),
    ({"messages": [{"role": "user", "content": 5}]}, "invalid_value", "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "invalid_value", "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]},
     "unsupported_feature", "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
     "unsupported_feature", "messages[0].content"),
    ({"messages": U, "stream": "yes"}, "invalid_value", "stream"),
    ({"messages": U, "temperature": 2.5}, "invalid_value", "temperature"),
    ({"messages": U, "temperature": -0.1}, "invalid_value", "temperature"),
    ({"messages": U, "top_p": 0}, "invalid_value", "top_p"),
    ({"messages": U, "top_p": 1.5}, "invalid_value", "top_p"),
    ({"messages": U, "top_k": "5"}, "invalid_value", "top_k"),
    ({"messages": U, "min_p": 2}, "invalid_value", "min_p"),
    ({"messages": U, "presence_penalty": 3}, "invalid_value", "presence_penalty"),
    ({"messages": U, "frequency_penalty": -2.5}, "invalid_value", "frequency_penalty"),
    ({"messages": U, "repetition_penalty": 0}, "invalid_value", "repetition_penalty"),
    ({"messages": U, "seed": 1.5}, "invalid_value", "seed"),
    ({"messages": U, "max_tokens": 0}, "invalid_value", "max_tokens"),
    ({"messages": U, "max_tokens": 2.5}, "invalid_value", "max_tokens"),
    ({"messages": U, "max_tokens": 1e300}, "invalid_value", "max_tokens"),
    ({"messages": U, "max_tokens": 5, "max_completion_tokens": 6}, "invalid_value",
     "max_completion_tokens"),
    ({"messages": U, "max_tokens": 1001}, "invalid_value", "max_tokens"),
    ({"messages": U, "logprobs": True, "top_logprobs": 21}, "invalid_value", "top_logprobs"),
    ({"messages": U, "top_logprobs": 2}, "invalid_value", "top_logprobs"),
    ({"messages": U, "n": 129}, "invalid_value", "n"),
    ({"messages": U, "n": 33}, "invalid_value", "n"),  # more than --max-pending (32) at once
    ({"messages": U, "n": 0}, "invalid_value", "n"),
    ({"messages": U, "response_format": {"type": "xml"}}, "invalid_value", "response_format"),
    ({"messages": U, "response_format": {"type": "json_schema"}}, "invalid_value",
     "response_format.json_schema"),
    ({"messages": U, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "pattern": "(?<=a)b"}}}}, "unsupported_feature",
     "response_format.json_schema.schema"),
    ({"messages": U, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "required": 5}}}}, "invalid_value",
     "response_format.json_schema.schema"),
    ({"messages": U, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": [1]}}}, "invalid_value", "response_format.json_schema.schema"),
    ({"messages": U, "response_format": {"type": "json_schema", "json_schema": {
        "name": 7, "schema": {}}}}, "invalid_value", "response_format.json_schema.name"),
    ({"messages": U, "response_format": {"type": "json_object", "schema": {"enum": []}}},
     "invalid_value", "response_format.schema"),
    ({"messages": U, "response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""},
     "invalid_value", "grammar"),
    ({"messages": U, "grammar": "root ::= foo"}, "invalid_value", "grammar"),
    ({"messages": U, "grammar": 5}, "invalid_value", "grammar"),
    ({"messages": U, "guided_choice": []}, "invalid_value", "guided_choice"),
    ({"messages": U, "guided_choice": ["a", 1]}, "invalid_value", "guided_choice"),
    ({"messages": U, "guided_json": "{not json"}, "invalid_value", "guided_json"),
    ({"messages": U, "guided_regex": "(a"}, "invalid_value", "guided_regex"),
    ({"messages": U, "guided_regex": "a\\1"}, "unsupported_feature", "guided_regex"),
    ({"messages": U, "json_schema": {"type": "string", "pattern": "(?=a)"}},
     "unsupported_feature", "json_schema"),
    ({"messages": U, "structured_outputs": {"choice": ["a"], "grammar": "root ::= \"a\""}},
     "invalid_value", "structured_outputs"),
    ({"messages": U, "structured_outputs": {"regex": "(?=a)"}}, "unsupported_feature",
     "structured_outputs.regex"),
    ({"messages": U, "structured_outputs": {"xml": "a"}}, "unsupported_feature",
     "structured_outputs.xml"),
    ({"messages": U, "reasoning_effort": "max"}, "invalid_value", "reasoning_effort"),
    ({"messages": U, "chat_template_kwargs": {"enable_thinking": "yes"}}, "invalid_value",
     "chat_template_kwargs.enable_thinking"),
    ({"messages": U, "tools": [{"type": "function"}]}, "invalid_value",
     "tools[0].function.name"),
    ({"messages": U, "tools": {"type": "function"}}, "invalid_value", "tools"),
    ({"messages": U, "tools": [{"type": "custom", "custom": {"name": "f"}}]},
     "unsupported_feature", "tools[0]"),
    ({"messages": U, "tools": [{"type": "function", "function": {"name": "f",
                                                               "parameters": [1]}}]},
     "invalid_value", "tools[0].function.parameters"),
    ({"messages": U, "tool_choice": "required"}, "invalid_value", "tool_choice"),
    ({"messages": U, "tools": TOOLS, "tool_choice": {"type": "function",
                                                     "function": {"name": "get_time"}}},
     "invalid_value", "tool_choice.function.name"),
    ({"messages": U, "tools": TOOLS, "tool_choice": {"type": "function", "name": "x"}},
     "invalid_value", "tool_choice"),
    ({"messages": U, "tools": TOOLS, "tool_choice": "required",
      "response_format": {"type": "json_object"}}, "unsupported_feature", "tool_choice"),
    ({"messages": U, "tools": TOOLS, "tool_choice": "sometimes"}, "invalid_value",
     "tool_choice"),
    ({"messages": U, "functions": [{"name": "f"}]}, "unsupported_feature", "functions"),
    ({"messages": U + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": "}}]}]},
     "invalid_value", "messages[1].tool_calls[0].function.arguments"),
    ({"messages": U + [{"role": "assistant", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "[1, 2]"}}]}]},
     "invalid_value", "messages[1].tool_calls[0].function.arguments"),
    ({"messages": U + [{"role": "assistant", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"arguments": "{}"}}]}]},
     "invalid_value", "messages[1].tool_calls[0].function.name"),
    ({"messages": [{"role": "user", "content": "u", "tool_calls": []}]}, "invalid_value",
     "messages[0].tool_calls"),
    ({"messages": U + [{"role": "assistant", "content": "a", "function_call": {"name": "f"}}]},
     "unsupported_feature", "messages[1].function_call"),
    ({"messages": U + [{"role": "tool", "content": "r", "tool_call_id": 5}]}, "invalid_value",
     "messages[1].tool_call_id"),
    ({"messages": U, "logit_bias": [[1, 2]]}, "invalid_value", "logit_bias"),
    ({"messages": U, "logit_bias": {"a1": 2}}, "invalid_value", "logit_bias"),
    ({"messages": U, "logit_bias": {"-1": 2}}, "invalid_value", "logit_bias"),
    ({"messages": U, "logit_bias": {"1": 101}}, "invalid_value", "logit_bias"),
    ({"messages": U, "logit_bias": {"1": "2"}}, "invalid_value", "logit_bias"),
    ({"messages": U, "logit_bias": {"1": 2, "01": 3}}, "invalid_value", "logit_bias"),
    ({"messages": U, "logit_bias": {"999999": 2}}, "invalid_value", "logit_bias"),
    ({"messages": U, "audio": {"voice": "alloy"}}, "unsupported_feature", "audio"),
    ({"messages": U, "min_tokens": -1}, "invalid_value", "min_tokens"),
    ({"messages": U, "min_tokens": 5, "max_tokens": 4}, "invalid_value", "min_tokens"),
    ({"messages": U, "min_tokens": 1, "response_format": {"type": "json_object"}},
     "unsupported_feature", "min_tokens"),
    ({"messages": U, "stop_token_ids": 5}, "invalid_value", "stop_token_ids"),
    ({"messages": U, "include_stop_str_in_output": "yes"}, "invalid_value",
     "include_stop_str_in_output"),
    ({"messages": U, "prediction": "text"}, "invalid_value", "prediction"),
    ({"messages": U, "prediction": {"type": "content", "content": [{"type": "text"}]}},
     "invalid_value", "prediction.content"),
    ({"messages": U, "stop_token_ids": [1, -1]}, "invalid_value", "stop_token_ids"),
    ({"messages": U, "stop_token_ids": [1, "2"]}, "invalid_value", "stop_token_ids"),
    ({"messages": U, "stop_token_ids": [999999]}, "invalid_value", "stop_token_ids"),
    ({"messages": U, "stop_token_ids": list(range(65))}, "invalid_value", "stop_token_ids"),
    ({"messages": U, "stop": ["a", "b", "c", "d", "e"]}, "invalid_stop", "stop"),
    ({"messages": U, "stop": 5}, "invalid_stop", "stop"),
    ({"messages": U, "stop": [""]}, "invalid_stop", "stop"),
    ({"messages": U, "stop": ["a", 1]}, "invalid_stop", "stop"),
    ({"messages": [{"role": "system", "content": "s"}, {"role": "system", "content": "s"},
                   {"role": "user", "content": "u"}]}, "invalid_value", "messages"),
])
def test_400(srv, body, code, param):
    expect(srv, 400, code, "POST", "/v1/chat/completions", body, param=param)


@pytest.mark.parametrize("body,code", [
    ({}, "invalid_value"),
    ({"prompt": 5}, "invalid_value"),
    ({"prompt": ["a", 5]}, "invalid_value"),
    ({"prompt": ["a", [1, -2]]}, "invalid_value"),
    ({"prompt": ["a", [1, 999999]]}, "invalid_value"),
    ({"prompt": ["a", ""]}, "invalid_value"),
    ({"prompt": ["a"] * 129}, "invalid_value"),
    ({"prompt": ["a"] * 11, "n": 3}, "invalid_value"),  # 33 answers: over --max-pending
    ({"prompt": [1, -2]}, "invalid_value"),
    ({"prompt": [1, 999999]}, "invalid_value"),
    ({"prompt": ""}, "invalid_value"),
    ({"prompt": "x", "echo": 1}, "invalid_value"),
    ({"prompt": "x", "max_tokens": 0}, "invalid_value"),
    ({"prompt": "x", "logprobs": 21}, "invalid_value"),
    ({"prompt": "x", "suffix": 5}, "invalid_value"),
    ({"prompt": "x", "suffix": "y", "echo": True}, "invalid_value"),  # no prompt to echo
    ({"prompt": "x", "n": 3, "best_of": 2}, "invalid_value"),  # fewer answers made than returned
    ({"prompt": "x", "best_of": 2, "stream": True}, "invalid_value"),  # best known only at the end
    ({"prompt": "x", "best_of": 129}, "invalid_value"),
    ({"prompt": ["a"] * 3, "best_of": 11}, "invalid_value"),  # 33 answers: over --max-pending
    ({"prompt": "x", "logit_bias": {"5": -101}}, "invalid_value"),
    ({"prompt": [1, 2], "logit_bias": {"999999": 1}}, "invalid_value"),
])
def test_400_completions(srv, body, code):
    expect(srv, 400, code, "POST", "/v1/completions", body)


def test_context_length_exceeded_names_both_numbers(srv):
    long = "word " * 3000
    _, e = expect(srv, 400, "context_length_exceeded", "POST", "/v1/chat/completions",
                  chat(long, max_tokens=900))
    st, _, t = srv.post("/tokenize", {"messages": [{"role": "user", "content": long}]})
    n = t["count"]
    assert "4096" in e["message"] and str(n) in e["message"] and "900" in e["message"]
    # a prompt that alone fills the context: also refused, never truncated
    expect(srv, 400, "context_length_exceeded", "POST", "/v1/completions",
           {"prompt": "word " * 5000})


def test_validation_order(srv):
    # each body fails several checks; the documented first one must win
    expect(srv, 404, "model_not_found", "POST", "/v1/chat/completions",
           {"model": "nope", "messages": [], "temperature": 9})
    expect(srv, 400, "invalid_value", "POST", "/v1/chat/completions",
           {"messages": [], "temperature": 9}, param="messages")
    expect(srv, 400, "invalid_value", "POST", "/v1/chat/completions",
           {"messages": U, "temperature": 9, "top_p": 9}, param="temperature")
    # logit_bias after repetition_penalty, before logprobs; its ids against the vocabulary
    # before the prompt is read
    expect(srv, 400, "invalid_value", "POST", "/v1/chat/completions",
           {"messages": U, "repetition_penalty": 9, "logit_bias": {"x": 1}},
           param="repetition_penalty")
    expect(srv, 400, "invalid_value", "POST", "/v1/chat/completions",
           {"messages": U, "logit_bias": {"x": 1}, "top_logprobs": 5}, param="logit_bias")
    expect(srv, 400, "invalid_value", "POST", "/v1/chat/completions",
           {"messages": [{"role": "user", "content": "w " * 5000}],
            "logit_bias": {"999999": 1}}, param="logit_bias")
    # min_tokens and stop_token_ids after return_token_ids, before response_format; their
    # checks against the answer's length and the vocabulary after the stop strings'
    expect(srv, 400, "invalid_value", "POST", "/v1/chat/completions",
           {"messages": U, "return_token_ids": 1, "min_tokens": -1}, param="return_token_ids")
    expect(srv, 400, "invalid_value", "POST", "/v1/chat/completions",
           {"messages": U, "min_tokens": -1, "stop_token_ids": 5}, param="min_tokens")
    expect(srv, 400, "invalid_value", "POST", "/v1/chat/completions",
           {"messages": U, "stop_token_ids": 5, "response_format": 5}, param="stop_token_ids")
    # prediction after include_stop_str_in_output, before response_format
    expect(srv, 400, "invalid_value", "POST", "/v1/chat/completions",
           {"messages": U, "include_stop_str_in_output": 1, "prediction": 5},
           param="include_stop_str_in_output")
    expect(srv, 400, "invalid_value", "POST", "/v1/chat/completions",
           {"messages": U, "prediction": 5, "response_format": 5}, param="prediction")
    expect(srv, 400, "invalid_stop", "POST", "/v1/chat/completions",
           {"messages": U, "stop": 5, "stop_token_ids": [999999]})
    expect(srv, 400, "invalid_value", "POST", "/v1/chat/completions",
           {"messages": U, "stop_token_ids": [999999], "min_tokens": 9, "max_tokens": 1},
           param="stop_token_ids")
    # context before stop parsing
    expect(srv, 400, "context_length_exceeded", "POST", "/v1/chat/completions",
           {"messages": [{"role": "user", "content": "w " * 5000}], "stop": 5})
    # headers before the body: wrong method beats everything, content type beats bad JSON
    expect(srv, 405, "method_not_allowed", "GET", "/v1/chat/completions")
    expect(srv, 415, "unsupported_media_type", "POST", "/v1/chat/completions", "{bad",
           headers={"Content-Type": "text/plain"})


def test_404_405(srv):
    expect(srv, 404, "not_found", "GET", "/v2/nothing")
    expect(srv, 404, "not_found", "POST", "/v1/chat/completion", {"messages": U})
    expect(srv, 404, "model_not_found", "POST", "/v1/completions", {"model": "gpt-4",
                                                                    "prompt": "x"})
    hd, _ = expect(srv, 405, "method_not_allowed", "POST", "/health", {})
    assert hd["allow"] == "GET"
    expect(srv, 405, "method_not_allowed", "DELETE", "/v1/models")
    expect(srv, 405, "method_not_allowed", "GET", "/tokenize")


def test_415(srv):
    for ct in ("text/plain", "application/x-www-form-urlencoded", "application/jsonx"):
        expect(srv, 415, "unsupported_media_type", "POST", "/v1/chat/completions",
               json.dumps({"messages": U}), headers={"Content-Type": ct})
    st, _, data = srv.request("POST", "/v1/chat/completions", json.dumps(chat("x", max_tokens=1)),
                              headers={"Content-Type": "application/json; charset=utf-8"})
    assert st == 200


def test_413_declared_and_streamed(srv):
    big = json.dumps(chat("x" * 70000))
    expect(srv, 413, "request_body_too_large", "POST", "/v1/chat/completions", big)
    # declared size over the cap: refused from the headers, before the body is read
    resp = raw(srv.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
               b"application/json\r\nContent-Length: 999999999\r\n\r\n{")
    assert resp.startswith(b"HTTP/1.1 413"), resp[:100]
    # chunked upload: no length, caught while it streams in
    body = big.encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 8192]), body[i:i + 8192])
                       for i in range(0, len(body), 8192)) + b"0\r\n\r\n"
    resp = raw(srv.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
               b"application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
    assert resp.startswith(b"HTTP/1.1 413"), resp[:100]
    assert b"request_body_too_large" in resp


def test_header_limit(srv):
    resp = raw(srv.port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100000 +
               b"\r\n\r\n")
    assert resp.split(b" ")[1] in (b"413", b"431"), resp[:100]
    assert srv.request("GET", "/health")[0] == 200


def test_health_and_models_ok(srv):
    st, _, body = srv.request("GET", "/health")
    assert st == 200 and json.loads(body) == {"status": "ok"}
    st, _, body = srv.request("GET", "/v1/models")
    assert st == 200 and json.loads(body)["data"][0]["id"] == "serve-tiny"


def test_api_key():
    with Server("--api-key", "s3cret") as s:
        for hdr in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"},
                    {"Authorization": "Bearer s3cre"}, {"Authorization": "Bearer s3cretX"}):
            expect(s, 401, "invalid_api_key", "GET", "/v1/models", headers=hdr)
            expect(s, 401, "invalid_api_key", "POST", "/v1/chat/completions", {"messages": U},
                   headers=hdr)
        st, _, _ = s.request("GET", "/v1/models", headers={"Authorization": "Bearer s3cret"})
        assert st == 200
        assert s.request("GET", "/health")[0] == 200  # health stays open for probes
        r = s.client(api_key="s3cret").chat.completions.create(
            model="serve-tiny", messages=U, max_tokens=2, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 2  # (sampled: an early end would shorten it)
    # the key may come from the environment
    with Server(env={"TESSERA_API_KEY": "envkey"}) as s:
        expect(s, 401, "invalid_api_key", "GET", "/v1/models")
        assert s.request("GET", "/v1/models", headers={"Authorization": "Bearer envkey"})[0] == 200


def test_model_loading():
    with Server("--debug-load-delay-ms", "1500", wait_ready=False) as s:
        for path, method, body in (("/health", "GET", None), ("/v1/models", "GET", None),
                                   ("/v1/chat/completions", "POST", {"messages": U}),
                                   ("/metrics", "GET", None)):
            hd, _ = expect(s, 503, "model_loading", method, path, body)
            assert "retry-after" in hd
        s.wait_ready()
        assert s.request("GET", "/health")[0] == 200


def test_no_500_and_still_alive(srv):
    m = srv.metrics()
    assert not any('status="500"' in k for k in m), m


def test_device_without_gpu_fails_cleanly():
    """--device cuda where there is no CUDA build or no GPU: one clear line, exit status 2, no
    hang; a bad device name is a usage error."""
    import subprocess
    from server_util import binary, tiny_model
    m = tiny_model()
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    p = subprocess.run([binary(), "serve", "-m", m, "--port", "0", "--device", "cuda"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "CUDA" in p.stderr, p.stderr
    p = subprocess.run([binary(), "serve", "-m", m, "--device", "tpu"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0 and "bad --device 'tpu'" in p.stderr, p.stderr


def test_a_nul_character_is_refused_by_name(srv):
    """A string holding U+0000 is refused with a message that says so (a model's answer can
    hold one, and a client that sends it back is told why)."""
    st, _, e = srv.post("/v1/chat/completions",
                        '{"messages": [{"role": "user", "content": "a\\u0000b"}]}')
    assert st == 400 and "U+0000" in e["error"]["message"], e
