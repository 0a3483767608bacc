/* Gemma 3 chat rendering against jinja2 renderings of the model's template (fixtures from
 * tools/gen_gemma_chat_fixtures.py): exact text, the control/text segment split, and the
 * template's errors. */
#include "testutil.h"
#include "text/chat.h"

#include <jansson.h>
#include <string.h>

static ts_chat_role role_of(const char *r) {
    if (strcmp(r, "system") == 0) return TS_ROLE_SYSTEM;
    if (strcmp(r, "user") == 0) return TS_ROLE_USER;
    if (strcmp(r, "assistant") == 0) return TS_ROLE_ASSISTANT;
    return TS_ROLE_TOOL;
}

/* Renders one fixture case; returns 1 when it matches. */
static int run_case(const json_t *c) {
    const char *name = json_string_value(json_object_get(c, "name"));
    const json_t *msgs = json_object_get(c, "messages");
    int n = (int)json_array_size(msgs);
    ts_chat_msg m[32] = {{0}};
    ts_chat_part parts[32][8];
    for (int i = 0; i < n && i < 32; i++) {
        const json_t *jm = json_array_get(msgs, (size_t)i);
        const json_t *content = json_object_get(jm, "content");
        m[i].role = role_of(json_string_value(json_object_get(jm, "role")));
        if (json_is_string(content)) {
            m[i].content = json_string_value(content);
            continue;
        }
        for (size_t k = 0; k < json_array_size(content) && k < 8; k++) {
            const json_t *p = json_array_get(content, k);
            const char *type = json_string_value(json_object_get(p, "type"));
            parts[i][k].kind = strcmp(type, "image") == 0 ? TS_PART_IMAGE : TS_PART_TEXT;
            parts[i][k].text = json_string_value(json_object_get(p, "text"));
        }
        m[i].parts = parts[i];
        m[i].n_parts = (int)json_array_size(content);
    }
    ts_chat_opts o;
    ts_chat_opts_default(&o);
    o.add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt"));
    o.continue_final = json_is_true(json_object_get(c, "continue_final_message"));
    ts_chat_out out;
    ts_status st = ts_chat_render_gemma(m, n, &o, &out);
    int ok;
    if (json_object_get(c, "error")) {
        ok = st == TS_ERR_INVALID && strstr(ts_last_error(), "alternate") != NULL;
        CHECKF(ok, "%s: expected the alternation error, got %d", name, (int)st);
        ts_chat_out_free(&out);
        return ok;
    }
    CHECKF(st == TS_OK, "%s: %s", name, ts_last_error());
    if (st != TS_OK) return 0;
    const char *expected = json_string_value(json_object_get(c, "expected"));
    size_t len;
    const char *text = ts_chat_flatten(&out, &len);
    ok = len == strlen(expected) && memcmp(text, expected, len) == 0;
    CHECKF(ok, "%s: rendered\n[%s]\nexpected\n[%s]", name, text, expected);
    const json_t *segs = json_object_get(c, "segments");
    int seg_ok = (int)json_array_size(segs) == out.n_segs;
    for (int s = 0; seg_ok && s < out.n_segs; s++) {
        const json_t *js = json_array_get(segs, (size_t)s);
        const char *kind = json_string_value(json_array_get(js, 0));
        const char *stext = json_string_value(json_array_get(js, 1));
        bool control = strcmp(kind, "control") == 0;
        seg_ok = control == (out.segs[s].kind == TS_CHAT_SEG_CONTROL) &&
                 out.segs[s].len == strlen(stext) &&
                 memcmp(out.text + out.segs[s].off, stext, out.segs[s].len) == 0;
    }
    CHECKF(seg_ok, "%s: segments differ (%d vs %d)", name, out.n_segs, (int)json_array_size(segs));
    ts_chat_out_free(&out);
    return ok && seg_ok;
}

static void test_fixtures(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/chat/gemma_cases.json",
             tu_env("TS_FIXTURES", "tests/fixtures"));
    json_error_t err;
    json_t *doc = json_load_file(path, 0, &err);
    CHECKF(doc != NULL, "%s: %s", path, err.text);
    if (!doc) return;
    const json_t *cases = json_object_get(doc, "cases");
    int n = (int)json_array_size(cases), pass = 0;
    CHECK(n >= 12);
    for (int i = 0; i < n; i++)
        pass += run_case(json_array_get(cases, (size_t)i));
    printf("gemma chat fixtures: %d/%d cases match\n", pass, n);
    json_decref(doc);
}

static void test_errors(void) {
    ts_chat_opts o;
    ts_chat_opts_default(&o);
    ts_chat_out out;
    CHECK(ts_chat_render_gemma(NULL, 0, &o, &out) == TS_ERR_INVALID);
    ts_chat_msg bad = {.role = TS_ROLE_USER, .content = "\xff\xfe"};
    CHECK(ts_chat_render_gemma(&bad, 1, &o, &out) == TS_ERR_INVALID);
    /* a system message whose first part is an image has no text to fold in */
    ts_chat_part img = {.kind = TS_PART_IMAGE};
    ts_chat_msg sys[2] = {{.role = TS_ROLE_SYSTEM, .parts = &img, .n_parts = 1},
                          {.role = TS_ROLE_USER, .content = "x"}};
    CHECK(ts_chat_render_gemma(sys, 2, &o, &out) == TS_ERR_INVALID);
    CHECK(out.text == NULL && out.n_segs == 0);
    /* an assistant's tool calls without tools: the template leaves them out; refused here */
    ts_chat_tool_call call = {"f", "{}"};
    ts_chat_msg turns[3] = {
        {.role = TS_ROLE_USER, .content = "hi"},
        {.role = TS_ROLE_ASSISTANT, .content = "ok", .tool_calls = &call, .n_tool_calls = 1},
        {.role = TS_ROLE_USER, .content = "and?"}};
    CHECK(ts_chat_render_gemma(turns, 3, &o, &out) == TS_ERR_UNSUPPORTED);
    o.tools_json = "[]"; /* no tools either */
    CHECK(ts_chat_render_gemma(turns, 3, &o, &out) == TS_ERR_UNSUPPORTED);
    turns[1].n_tool_calls = 0;
    CHECK(ts_chat_render_gemma(turns, 3, &o, &out) == TS_OK);
    ts_chat_out_free(&out);
}

/* With tools, the function-calling form this renderer writes (the template has none): the
 * functions in the first user turn after the system text, an assistant's calls as a Python
 * list, a tool's result in the user's turn (joined with the user's next message). */
static void test_tools(void) {
    ts_chat_opts o;
    ts_chat_opts_default(&o);
    o.tools_json = "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]";
    ts_chat_tool_call call = {"f", "{\"s\": \"x\", \"l\": [1, true, null]}"};
    ts_chat_msg m[5] = {{.role = TS_ROLE_SYSTEM, .content = "Sys."},
                        {.role = TS_ROLE_USER, .content = "hi"},
                        {.role = TS_ROLE_ASSISTANT, .tool_calls = &call, .n_tool_calls = 1},
                        {.role = TS_ROLE_TOOL, .content = "42"},
                        {.role = TS_ROLE_USER, .content = "and?"}};
    ts_chat_out out;
    CHECK(ts_chat_render_gemma(m, 5, &o, &out) == TS_OK);
    const char *want =
        "<bos><start_of_turn>user\nSys.\n\nYou can call the functions below. To call one or "
        "more of them, reply with nothing but a Python list of the calls, like "
        "[function_name(argument=value, other_argument=value)], with the argument values "
        "written as Python literals. Otherwise reply as usual.\n\n"
        "{\"type\": \"function\", \"function\": {\"name\": \"f\"}}\n\nhi<end_of_turn>\n"
        "<start_of_turn>model\n[f(s=\"x\", l=[1, True, None])]<end_of_turn>\n"
        "<start_of_turn>user\n```tool_output\n42\n```\n\nand?<end_of_turn>\n"
        "<start_of_turn>model\n";
    CHECK(out.text && !strcmp(out.text, want));
    if (out.text && strcmp(out.text, want)) fprintf(stderr, "  got: %s\n", out.text);
    ts_chat_out_free(&out);
    /* the turns still alternate: an assistant first is refused */
    CHECK(ts_chat_render_gemma(m + 2, 3, &o, &out) == TS_ERR_INVALID);
}

int main(void) {
    test_fixtures();
    test_errors();
    test_tools();
    return tu_report("test_chat_gemma");
}
