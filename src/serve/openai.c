#include "serve/openai.h"

#include "base/status.h"
#include "serve/base64.h"
#include "serve/json_load.h"
#include "serve/lora.h"
#include "text/json_schema.h"
#include "text/utf8.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

bool serve_fail(serve_error *e, int status, const char *code, const char *param, const char *fmt,
                ...) {
    e->status = status;
    e->code = code;
    e->type = status >= 500 ? (status == 503 ? "unavailable_error" : "server_error")
              : status == 401 ? "authentication_error"
              : status == 404 ? "not_found_error"
                              : "invalid_request_error";
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

char *serve_error_json(const serve_error *e) {
    /* A message may quote the request ('%.40s' of a role, '%.100s' of a model name) and a cut
     * there, or at the end of the buffer, can split a UTF-8 character. json_pack refuses
     * ill-formed UTF-8, and a NULL envelope reaches the client as a 500 "out of memory" instead
     * of the 4xx meant, so ill-formed bytes become U+FFFD first (text/utf8.h). */
    ts_strbuf msg = {0};
    if (ts_utf8_append_lossy(&msg, e->message, strlen(e->message)) != TS_OK) {
        ts_strbuf_free(&msg);
        return NULL;
    }
    json_t *err =
        json_pack("{s:s, s:s, s:o, s:s}", "message", msg.data ? msg.data : "", "type", e->type,
                  "param", e->param[0] ? json_string(e->param) : json_null(), "code", e->code);
    ts_strbuf_free(&msg);
    json_t *root = err ? json_pack("{s:o}", "error", err) : NULL;
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}

bool serve_json_parse(const char *body, size_t len, json_t **root, serve_error *e) {
    if (!serve_json_parse_value(body, len, root, e)) return false;
    if (!json_is_object(*root)) {
        json_decref(*root);
        *root = NULL;
        return serve_fail(e, 400, "invalid_request_body", NULL, "the body must be a JSON object");
    }
    return true;
}

bool serve_json_parse_value(const char *body, size_t len, json_t **root, serve_error *e) {
    *root = NULL;
    if (len == 0) return serve_fail(e, 400, "invalid_request_body", NULL, "the body is empty");
    json_error_t je;
    bool too_deep;
    json_t *v =
        serve_json_load(body, len, SERVE_JSON_LONG, SERVE_MAX_JSON_DEPTH, &too_deep, &je, NULL);
    if (too_deep)
        return serve_fail(e, 400, "invalid_request_body", NULL, "JSON nested deeper than %d levels",
                          SERVE_MAX_JSON_DEPTH);
    /* text is C strings from here on: a NUL inside one would cut it short, so none is taken
     * (a model can write one - a byte token - and a client that sends it back is told so) */
    if (!v && strstr(je.text, "JSON_ALLOW_NUL"))
        return serve_fail(e, 400, "invalid_request_body", NULL,
                          "invalid JSON at byte %d: a string holds the character U+0000 "
                          "(\\u0000), which this server does not take in text",
                          je.position);
    if (!v)
        return serve_fail(e, 400, "invalid_request_body", NULL, "invalid JSON at byte %d: %s",
                          je.position, je.text);
    *root = v;
    return true;
}

/* ---- typed fields: absent or null = keep the default ---------------------------------- */

static const json_t *field(const json_t *o, const char *name) {
    const json_t *v = json_object_get(o, name);
    return v && !json_is_null(v) ? v : NULL;
}

static bool get_bool(const json_t *o, const char *name, bool *out, serve_error *e) {
    const json_t *v = field(o, name);
    if (!v) return true;
    if (!json_is_boolean(v)) return serve_fail(e, 400, "invalid_value", name, "'%s' must be a boolean", name);
    *out = json_is_true(v);
    return true;
}

static bool get_num(const json_t *o, const char *name, double lo, double hi, bool lo_open,
                    double *out, serve_error *e) {
    const json_t *v = field(o, name);
    if (!v) return true;
    if (!json_is_number(v)) return serve_fail(e, 400, "invalid_value", name, "'%s' must be a number", name);
    double x = json_number_value(v);
    if (!isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo))
        return serve_fail(e, 400, "invalid_value", name, "'%s' must be in %c%g, %g]", name,
                          lo_open ? '(' : '[', lo, hi);
    *out = x;
    return true;
}

static bool get_int(const json_t *o, const char *name, long long lo, long long hi, long long *out,
                    serve_error *e) {
    const json_t *v = field(o, name);
    if (!v) return true;
    long long x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (long long)json_real_value(v);
    } else {
        return serve_fail(e, 400, "invalid_value", name, "'%s' must be an integer", name);
    }
    if (x < lo || x > hi)
        return serve_fail(e, 400, "invalid_value", name, "'%s' must be in [%lld, %lld]", name, lo,
                          hi);
    *out = x;
    return true;
}

/* Fields OpenAI defines that we do not implement yet: refused, never silently dropped. */
static bool refuse_unsupported(const json_t *o, const char *const *names, serve_error *e) {
    for (int i = 0; names[i]; i++)
        if (field(o, names[i]))
            return serve_fail(e, 400, "unsupported_feature", names[i],
                              "'%s' is not supported by this server yet", names[i]);
    return true;
}

static void *own(serve_request *r, void *s) {
    void **p = realloc(r->owned, (size_t)(r->n_owned + 1) * sizeof *p);
    if (!p) {
        free(s);
        return NULL;
    }
    r->owned = p;
    r->owned[r->n_owned++] = s;
    return s;
}

/* An image part's data: URL, {"url": "data:<type>;base64,<data>"} (OpenAI's image_url), or
 * (video) a video_url part's (vLLM's), into the request's images. An http(s) or file: URL is
 * kept for serve/fetch.c (which refuses it unless the server reads such URLs); other URLs are
 * refused. */
static bool parse_image(serve_request *r, const json_t *part, const char *param, bool video,
                        serve_error *e) {
    const char *key = video ? "video_url" : "image_url";
    const json_t *iu = json_object_get(part, key);
    const json_t *url = json_is_object(iu) ? json_object_get(iu, "url") : NULL;
    if (!json_is_string(url))
        return serve_fail(e, 400, "invalid_value", param, "%s: an %s part needs '%s': {'url': ...}",
                          param, key, key);
    if (r->n_images == SERVE_MAX_IMAGES)
        return serve_fail(e, 400, "invalid_value", param,
                          "%s: at most %d images and videos a request", param, SERVE_MAX_IMAGES);
    const char *u = json_string_value(url);
    serve_image_data *im = &r->images[r->n_images];
    if (!strncasecmp(u, "http://", 7) || !strncasecmp(u, "https://", 8) ||
        !strncasecmp(u, "file://", 7)) {
        *im = (serve_image_data){.url = u, .video = video};
        snprintf(im->param, sizeof im->param, "%s", param);
        r->n_images++;
        return true;
    }
    const char *comma = strchr(u, ',');
    if (strncmp(u, "data:", 5) != 0 || !comma)
        return serve_fail(e, 400, "invalid_value", param,
                          "%s: only data: URLs (the %s inline, base64), http(s) URLs and file: "
                          "URLs are read",
                          param, video ? "video" : "image");
    size_t head = (size_t)(comma - u);
    if (head < 7 || strncmp(comma - 7, ";base64", 7) != 0)
        return serve_fail(e, 400, "invalid_value", param,
                          "%s: the data: URL must be base64 "
                          "(data:<type>;base64,<data>)",
                          param);
    size_t n = json_string_length(url) - head - 1;
    if (!serve_base64_decode(comma + 1, n, &im->data, &im->len)) {
        if (im->len == SIZE_MAX) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
        return serve_fail(e, 400, "invalid_value", param, "%s: the %s's base64 is malformed", param,
                          video ? "video" : "image");
    }
    im->video = video;
    snprintf(im->param, sizeof im->param, "%s", param);
    r->n_images++;
    return true;
}

/* content: a string, or a list of parts: text parts only are joined (as the template does);
 * with images, the text and image parts stay a list, in order. */
/* The text parts of a list (checked: each has a string "text"), joined into a string the
 * request owns (total: their bytes and the terminator); NULL without memory. */
static const char *join_text(serve_request *r, const json_t *parts, size_t total) {
    char *s = malloc(total), *at = s;
    if (!s || !own(r, s)) return NULL;
    size_t k;
    const json_t *part;
    json_array_foreach(parts, k, part) {
        const json_t *text = json_object_get(part, "text");
        memcpy(at, json_string_value(text), json_string_length(text));
        at += json_string_length(text);
    }
    *at = 0;
    return s;
}

static bool parse_content(serve_request *r, const json_t *c, int i, ts_chat_message *cm,
                          serve_error *e) {
    char param[48];
    snprintf(param, sizeof param, "messages[%d].content", i);
    if (json_is_string(c)) {
        cm->content = json_string_value(c);
        return true;
    }
    if (!json_is_array(c))
        return serve_fail(e, 400, "invalid_value", param, "%s must be a string or a list of parts",
                          param);
    size_t total = 1, k;
    int images = 0;
    const json_t *part;
    json_array_foreach(c, k, part) {
        const json_t *type = json_object_get(part, "type");
        char pp[96];
        snprintf(pp, sizeof pp, "%s[%zu]", param, k);
        if (!json_is_object(part) || !json_is_string(type))
            return serve_fail(e, 400, "invalid_value", param,
                              "%s must be an object with a "
                              "'type'",
                              pp);
        const char *t = json_string_value(type);
        if (strcmp(t, "image_url") == 0 || strcmp(t, "video_url") == 0) {
            if (!parse_image(r, part, pp, t[0] == 'v', e)) return false;
            images++;
            continue;
        }
        if (strcmp(t, "input_audio") == 0 || strcmp(t, "file") == 0)
            return serve_fail(e, 400, "unsupported_feature", param,
                              "%s: '%s' parts are not "
                              "supported",
                              pp, t);
        const json_t *text = json_object_get(part, "text");
        if (strcmp(t, "text") != 0 || !json_is_string(text))
            return serve_fail(e, 400, "invalid_value", param,
                              "%s must be a text part with "
                              "a string 'text'",
                              pp);
        total += json_string_length(text);
    }
    if (images) {
        size_t np = json_array_size(c);
        ts_content_part *parts = own(r, calloc(np, sizeof *parts));
        if (!parts) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
        json_array_foreach(c, k, part) {
            const char *t = json_string_value(json_object_get(part, "type"));
            parts[k].text =
                strcmp(t, "text") == 0 ? json_string_value(json_object_get(part, "text")) : NULL;
            parts[k].video = strcmp(t, "video_url") == 0;
        }
        cm->content = NULL;
        cm->parts = parts;
        cm->n_parts = (int)np;
        return true;
    }
    cm->content = join_text(r, c, total);
    return cm->content ? true : serve_fail(e, 500, "internal_error", NULL, "out of memory");
}

/* An assistant message's tool_calls: [{id, type: "function", function: {name, arguments}}],
 * arguments being a JSON object in a string (OpenAI); the renderer reads that text. */
static bool parse_tool_calls(serve_request *r, const json_t *msg, int i, ts_chat_message *cm,
                             serve_error *e) {
    const json_t *tc = field(msg, "tool_calls");
    char param[80];
    snprintf(param, sizeof param, "messages[%d].tool_calls", i);
    if (!tc) return true;
    if (strcmp(cm->role, "assistant") != 0)
        return serve_fail(e, 400, "invalid_value", param, "only assistant messages have "
                          "tool_calls");
    if (!json_is_array(tc))
        return serve_fail(e, 400, "invalid_value", param, "%s must be a list", param);
    size_t n = json_array_size(tc), k;
    if (n == 0) return true;
    ts_tool_call *calls = own(r, calloc(n, sizeof *calls));
    if (!calls) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    const json_t *call;
    json_array_foreach(tc, k, call) {
        snprintf(param, sizeof param, "messages[%d].tool_calls[%zu]", i, k);
        const json_t *type = json_is_object(call) ? field(call, "type") : NULL;
        const json_t *fn = json_is_object(call) ? field(call, "function") : NULL;
        if (!json_is_object(fn) || (type && !json_is_string(type)))
            return serve_fail(e, 400, "invalid_value", param, "%s must be an object with a "
                              "'function' object", param);
        if (type && strcmp(json_string_value(type), "function") != 0)
            return serve_fail(e, 400, "unsupported_feature", param, "%s: only 'function' tool "
                              "calls are supported", param);
        const json_t *name = field(fn, "name"), *args = field(fn, "arguments");
        if (!json_is_string(name) || json_string_length(name) == 0) {
            snprintf(param, sizeof param, "messages[%d].tool_calls[%zu].function.name", i, k);
            return serve_fail(e, 400, "invalid_value", param, "%s must be a non-empty string",
                              param);
        }
        calls[k].name = json_string_value(name);
        snprintf(param, sizeof param, "messages[%d].tool_calls[%zu].function.arguments", i, k);
        if (args && !json_is_string(args))
            return serve_fail(e, 400, "invalid_value", param, "%s must be a string holding a "
                              "JSON object", param);
        if (!args || json_string_length(args) == 0) continue; /* no arguments */
        json_error_t je;
        json_t *obj = json_loadb(json_string_value(args), json_string_length(args), 0, &je);
        bool is_obj = json_is_object(obj);
        json_decref(obj);
        if (!obj)
            return serve_fail(e, 400, "invalid_value", param, "%s is not valid JSON: %s", param,
                              je.text);
        if (!is_obj)
            return serve_fail(e, 400, "invalid_value", param, "%s must be a JSON object", param);
        calls[k].arguments_json = json_string_value(args);
    }
    cm->tool_calls = calls;
    cm->n_tool_calls = (int)n;
    return true;
}

static bool parse_messages(serve_request *r, const json_t *root, serve_error *e) {
    const json_t *m = json_object_get(root, "messages");
    if (!m) return serve_fail(e, 400, "invalid_value", "messages", "'messages' is required");
    if (!json_is_array(m))
        return serve_fail(e, 400, "invalid_value", "messages", "'messages' must be a list");
    size_t n = json_array_size(m);
    if (n == 0) return serve_fail(e, 400, "invalid_value", "messages", "'messages' is empty");
    if (n > 100000)
        return serve_fail(e, 400, "invalid_value", "messages", "too many messages (%zu)", n);
    r->msgs = calloc(n, sizeof *r->msgs);
    if (!r->msgs) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *msg = json_array_get(m, i);
        char param[48];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(msg))
            return serve_fail(e, 400, "invalid_value", param, "%s must be an object", param);
        const json_t *role = json_object_get(msg, "role");
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!json_is_string(role))
            return serve_fail(e, 400, "invalid_role", param, "%s must be a string", param);
        const char *rs = json_string_value(role);
        static const char *const roles[] = {"system", "user", "assistant", "tool", "developer"};
        const char *mapped = NULL;
        for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++)
            if (strcmp(rs, roles[k]) == 0) mapped = k == 4 ? "system" : roles[k];
        if (!mapped)
            return serve_fail(e, 400, "invalid_role", param, "%s: unknown role '%.40s' (system, "
                              "user, assistant, tool)", param, rs);
        ts_chat_message *cm = &r->msgs[r->n_msgs++];
        cm->role = mapped;
        snprintf(param, sizeof param, "messages[%zu].function_call", i);
        if (field(msg, "function_call"))
            return serve_fail(e, 400, "unsupported_feature", param, "the legacy 'function_call' "
                              "is not supported; use 'tool_calls'");
        if (!parse_tool_calls(r, msg, (int)i, cm, e)) return false;
        const json_t *tid = field(msg, "tool_call_id");
        if (tid && !json_is_string(tid)) {
            snprintf(param, sizeof param, "messages[%zu].tool_call_id", i);
            return serve_fail(e, 400, "invalid_value", param, "%s must be a string", param);
        }
        const json_t *c = field(msg, "content");
        if (!c) {
            if (strcmp(mapped, "assistant") != 0) {
                snprintf(param, sizeof param, "messages[%zu].content", i);
                return serve_fail(e, 400, "invalid_value", param, "%s is required", param);
            }
            cm->content = "";
        } else if (!parse_content(r, c, (int)i, cm, e)) {
            return false;
        }
        /* an earlier answer's thinking: llama-server's and DeepSeek's field, or vLLM's and
         * OpenRouter's - a client that kept both sends both, the same */
        const json_t *rc = field(msg, "reasoning_content"), *rv = field(msg, "reasoning");
        if (rc || rv) {
            snprintf(param, sizeof param, "messages[%zu].%s", i,
                     rc ? "reasoning_content" : "reasoning");
            if (!json_is_string(rc ? rc : rv) || (rv && !json_is_string(rv)))
                return serve_fail(e, 400, "invalid_value", param, "%s must be a string", param);
            if (rc && rv && !json_equal((json_t *)rc, (json_t *)rv))
                return serve_fail(e, 400, "invalid_value", param,
                                  "messages[%zu]: reasoning_content and reasoning differ", i);
            if (strcmp(mapped, "assistant") == 0)
                cm->reasoning_content = json_string_value(rc ? rc : rv);
        }
    }
    return true;
}

/* vLLM's mm_processor_kwargs: settings of the model's processor for this request. Only "fps"
 * (a video's frames sampled a second) is read; any other key is refused, not ignored. */
static bool parse_mm_kwargs(serve_request *r, const json_t *root, serve_error *e) {
    const json_t *kw = field(root, "mm_processor_kwargs");
    if (!kw) return true;
    if (!json_is_object(kw))
        return serve_fail(e, 400, "invalid_value", "mm_processor_kwargs",
                          "'mm_processor_kwargs' must be an object");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)kw, k, v) {
        char param[96];
        snprintf(param, sizeof param, "mm_processor_kwargs.%.60s", k);
        if (strcmp(k, "fps") != 0)
            return serve_fail(e, 400, "unsupported_feature", param,
                              "%s: only 'fps' is read from mm_processor_kwargs", param);
        if (json_is_null(v)) continue;
        double x = json_is_number(v) ? json_number_value(v) : -1;
        if (!(x > 0 && x <= 1000))
            return serve_fail(e, 400, "invalid_value", param, "%s must be a number in (0, 1000]",
                              param);
        r->video_fps = x;
    }
    return true;
}

/* One prompt: a string, or a list of token ids (p, at param). */
static bool parse_one_prompt(serve_prompt *out, const json_t *p, const char *name,
                             const char *param, serve_error *e) {
    if (json_is_string(p)) {
        out->text = json_string_value(p);
        out->text_len = json_string_length(p);
        return true;
    }
    size_t n = json_array_size(p), i;
    const json_t *v;
    json_array_foreach(p, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > INT32_MAX)
            return serve_fail(e, 400, "invalid_value", name, "%s[%zu] must be a token id", param,
                              i);
    }
    out->ids = malloc((n ? n : 1) * sizeof *out->ids);
    if (!out->ids) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    json_array_foreach(p, i, v) out->ids[i] = (int32_t)json_integer_value(v);
    out->n_ids = (int)n;
    return true;
}

bool serve_parse_prompts(const json_t *root, const char *name, int max, serve_prompt **out,
                         int *n_out, serve_error *e) {
    *out = NULL, *n_out = 0;
    const json_t *p = json_object_get(root, name);
    if (!p || json_is_null(p))
        return serve_fail(e, 400, "invalid_value", name, "'%s' is required", name);
    bool several = json_is_array(p) && json_array_size(p) > 0 &&
                   (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)));
    if (!json_is_string(p) && !json_is_array(p))
        return serve_fail(e, 400, "invalid_value", name,
                          "'%s' must be a string, a list of token ids, or a list of those", name);
    size_t n = several ? json_array_size(p) : 1;
    if (n > (size_t)max)
        return serve_fail(e, 400, "invalid_value", name, "at most %d %ss in one request, not %zu",
                          max, name, n);
    *out = calloc(n, sizeof **out);
    if (!*out) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    *n_out = (int)n;
    for (size_t i = 0; i < n; i++) {
        const json_t *one = several ? json_array_get(p, i) : p;
        char param[48];
        snprintf(param, sizeof param, several ? "%s[%zu]" : "%s", name, i);
        if (several && !json_is_string(one) && !json_is_array(one))
            return serve_fail(e, 400, "invalid_value", name,
                              "%s must be a string or a list of token ids", param);
        if (!parse_one_prompt(&(*out)[i], one, name, param, e)) return false;
    }
    return true;
}

void serve_prompts_free(serve_prompt *p, int n) {
    for (int i = 0; p && i < n; i++)
        free(p[i].ids);
    free(p);
}

/* prompt: a string, a list of token ids, or a list of those (several prompts, each answered
 * by its own n choices, as OpenAI's legacy completions and vLLM do). */
static bool parse_prompt(serve_request *r, const json_t *root, serve_error *e) {
    return serve_parse_prompts(root, "prompt", SERVE_MAX_PROMPTS, &r->prompts, &r->n_prompts, e);
}

static int by_id(const void *a, const void *b) {
    int32_t x = ((const ts_logit_adjust *)a)->id, y = ((const ts_logit_adjust *)b)->id;
    return (x > y) - (x < y);
}

/* logit_bias: {"token id": bias in [-100, 100]} (OpenAI), each id at most once; the ids are
 * checked against the vocabulary by preparation. Kept sorted by id. */
static bool parse_logit_bias(serve_request *r, const json_t *o, serve_error *e) {
    const json_t *lb = field(o, "logit_bias");
    if (!lb) return true;
    if (!json_is_object(lb))
        return serve_fail(e, 400, "invalid_value", "logit_bias",
                          "'logit_bias' must be an object of token ids and biases");
    size_t n = json_object_size(lb);
    if (!n) return true;
    r->logit_bias = malloc(n * sizeof *r->logit_bias);
    if (!r->logit_bias) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)lb, key, v) {
        size_t len = strspn(key, "0123456789");
        if (len == 0 || key[len] || len > 9)
            return serve_fail(e, 400, "invalid_value", "logit_bias",
                              "logit_bias: '%.40s' is not a token id (a decimal number)", key);
        double b = json_is_number(v) ? json_number_value(v) : NAN;
        if (!(b >= -100 && b <= 100))
            return serve_fail(e, 400, "invalid_value", "logit_bias",
                              "logit_bias['%s'] must be a number in [-100, 100]", key);
        r->logit_bias[r->n_logit_bias++] =
            (ts_logit_adjust){(int32_t)atol(key), (float)b, 1.0f, 0.0f};
    }
    qsort(r->logit_bias, n, sizeof *r->logit_bias, by_id);
    for (size_t i = 1; i < n; i++)
        if (r->logit_bias[i].id == r->logit_bias[i - 1].id)
            return serve_fail(e, 400, "invalid_value", "logit_bias",
                              "logit_bias names token %d more than once", r->logit_bias[i].id);
    return true;
}

/* stop_token_ids: a list of token ids (checked against the vocabulary by preparation). */
static bool parse_stop_ids(serve_request *r, const json_t *o, serve_error *e) {
    const json_t *a = field(o, "stop_token_ids");
    if (!a) return true;
    if (!json_is_array(a) || json_array_size(a) > SERVE_MAX_STOP_IDS)
        return serve_fail(e, 400, "invalid_value", "stop_token_ids",
                          "'stop_token_ids' must be a list of at most %d token ids",
                          SERVE_MAX_STOP_IDS);
    size_t n = json_array_size(a);
    if (!n) return true;
    if (!(r->stop_ids = malloc(n * sizeof *r->stop_ids)))
        return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, i);
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id > INT32_MAX)
            return serve_fail(e, 400, "invalid_value", "stop_token_ids",
                              "stop_token_ids[%zu] is not a token id", i);
        r->stop_ids[r->n_stop_ids++] = (int32_t)id;
    }
    return true;
}

static bool parse_sampling(serve_request *r, const json_t *o, int max_tokens_cap, serve_error *e) {
    long long x = -1, y = -1;
    const char *mt = r->api == SERVE_API_CHAT ? "max_completion_tokens" : "max_tokens";
    /* a completion that echoes its prompt may ask for no answer: its prompt's log-probabilities
     * (how evaluation harnesses score a text) */
    bool echo = r->api == SERVE_API_COMPLETION && json_is_true(json_object_get(o, "echo"));
    if (!get_int(o, "max_tokens", echo ? 0 : 1, INT32_MAX, &x, e)) return false;
    if (r->api == SERVE_API_CHAT) {
        if (!get_int(o, "max_completion_tokens", 1, INT32_MAX, &y, e)) return false;
        if (x >= 0 && y >= 0 && x != y)
            return serve_fail(e, 400, "invalid_value", "max_completion_tokens",
                              "'max_tokens' (%lld) and 'max_completion_tokens' (%lld) differ", x,
                              y);
        if (x < 0) x = y;
    }
    if (x >= 0 && max_tokens_cap > 0 && x > max_tokens_cap)
        return serve_fail(e, 400, "invalid_value", x == y ? mt : "max_tokens",
                          "max_tokens %lld is over this server's cap of %d", x, max_tokens_cap);
    r->max_tokens = (int)x;
    double d;
    d = SERVE_DEFAULT_TEMPERATURE;
    if (!get_num(o, "temperature", 0, 2, false, &d, e)) return false;
    r->sp.temperature = (float)d;
    d = SERVE_DEFAULT_TOP_P;
    if (!get_num(o, "top_p", 0, 1, true, &d, e)) return false;
    r->sp.top_p = (float)d;
    x = SERVE_DEFAULT_TOP_K;
    if (!get_int(o, "top_k", -1, INT32_MAX, &x, e)) return false;
    r->sp.top_k = x < 0 ? 0 : (int)x;
    d = SERVE_DEFAULT_MIN_P;
    if (!get_num(o, "min_p", 0, 1, false, &d, e)) return false;
    r->sp.min_p = (float)d;
    if (field(o, "seed")) {
        if (!get_int(o, "seed", INT64_MIN, INT64_MAX, &x, e)) return false;
        r->sp.seed = (uint64_t)x;
        r->has_seed = true;
    }
    d = SERVE_DEFAULT_PRESENCE_PENALTY;
    if (!get_num(o, "presence_penalty", -2, 2, false, &d, e)) return false;
    r->presence_penalty = (float)d;
    d = SERVE_DEFAULT_FREQUENCY_PENALTY;
    if (!get_num(o, "frequency_penalty", -2, 2, false, &d, e)) return false;
    r->frequency_penalty = (float)d;
    d = SERVE_DEFAULT_REPETITION_PENALTY;
    if (!get_num(o, "repetition_penalty", 0, 2, true, &d, e)) return false;
    r->repetition_penalty = (float)d;
    return parse_logit_bias(r, o, e);
}

static bool parse_logprobs(serve_request *r, const json_t *o, serve_error *e) {
    if (r->api == SERVE_API_COMPLETION) { /* an int: how many alternatives */
        long long k = -1;
        if (!get_int(o, "logprobs", 0, 20, &k, e)) return false;
        r->top_logprobs = (int)k;
        return true;
    }
    bool lp = false;
    long long k = -1;
    if (!get_bool(o, "logprobs", &lp, e)) return false;
    if (!get_int(o, "top_logprobs", 0, 20, &k, e)) return false;
    if (k >= 0 && !lp)
        return serve_fail(e, 400, "invalid_value", "top_logprobs",
                          "'top_logprobs' needs 'logprobs': true");
    r->top_logprobs = lp ? (k < 0 ? 0 : (int)k) : -1;
    return true;
}

/* A grammar from text/ (st its status) as the request's constraint; a refusal is the
 * client's error, said in its words. */
static bool take_grammar(ts_status st, const char *param, serve_error *e) {
    if (st == TS_OK) return true;
    if (st == TS_ERR_NOMEM) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    return serve_fail(e, 400, st == TS_ERR_UNSUPPORTED ? "unsupported_feature" : "invalid_value",
                      param, "%s", ts_last_error());
}

/* The schema's grammar, or (schema NULL) any JSON object's; a schema the compiler refuses is
 * the client's error, said in its words. */
static bool compile_grammar(serve_request *r, const json_t *schema, const char *param,
                            serve_error *e) {
    char *text = NULL;
    if (schema) {
        if (!json_is_object(schema) && !json_is_boolean(schema))
            return serve_fail(e, 400, "invalid_value", param,
                              "'%s' must be a JSON Schema (an "
                              "object or a boolean)",
                              param);
        text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!text) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    }
    ts_status st = ts_grammar_from_json_schema(text, text ? strlen(text) : 0, &r->grammar);
    free(text);
    return take_grammar(st, param, e);
}

/* response_format: text; json_object (any JSON object; with llama-server's "schema" beside the
 * type, that schema); json_schema (OpenAI's {"name", "schema", "strict"}: the schema's
 * grammar, any JSON object when it has none). Both JSON types constrain the answer's content
 * to the grammar (the reasoning stays free). */
static bool parse_response_format(serve_request *r, const json_t *o, serve_error *e) {
    const json_t *rf = field(o, "response_format");
    if (!rf) return true;
    const json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
    if (!json_is_string(t))
        return serve_fail(e, 400, "invalid_value", "response_format",
                          "'response_format' must be an object with a 'type'");
    const char *ts = json_string_value(t);
    if (strcmp(ts, "text") == 0) return true;
    if (strcmp(ts, "json_object") == 0)
        return compile_grammar(r, json_object_get(rf, "schema"), "response_format.schema", e);
    if (strcmp(ts, "json_schema") != 0)
        return serve_fail(e, 400, "invalid_value", "response_format",
                          "unknown response_format type '%.40s'", ts);
    const json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js))
        return serve_fail(e, 400, "invalid_value", "response_format.json_schema",
                          "response_format 'json_schema' needs a 'json_schema' object");
    const json_t *name = json_object_get(js, "name");
    if (name && !json_is_string(name))
        return serve_fail(e, 400, "invalid_value", "response_format.json_schema.name",
                          "'response_format.json_schema.name' must be a string");
    const json_t *strict = json_object_get(js, "strict");
    if (strict && !json_is_boolean(strict) && !json_is_null(strict))
        return serve_fail(e, 400, "invalid_value", "response_format.json_schema.strict",
                          "'response_format.json_schema.strict' must be a boolean");
    return compile_grammar(r, json_object_get(js, "schema"), "response_format.json_schema.schema",
                           e);
}

/* vLLM's guided_choice: one of the strings, as written. */
static bool choice_grammar(serve_request *r, const json_t *v, const char *param, serve_error *e) {
    size_t n = json_is_array(v) ? json_array_size(v) : 0;
    if (n == 0 || n > 4096)
        return serve_fail(e, 400, "invalid_value", param,
                          "'%s' must be a list of 1 to 4096 "
                          "strings",
                          param);
    const char **c = malloc(n * sizeof *c);
    if (!c) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_array_get(v, i);
        c[i] = json_is_string(s) ? json_string_value(s) : NULL;
        if (!c[i] || !c[i][0]) {
            free(c);
            return serve_fail(e, 400, "invalid_value", param,
                              "'%s' must be a list of non-empty "
                              "strings",
                              param);
        }
    }
    ts_status st = ts_grammar_from_choices(c, (int)n, &r->grammar);
    free(c);
    return take_grammar(st, param, e);
}

/* A grammar given as a string, made by `make` (what: the string's kind, for the message):
 * GBNF, or a regular expression the whole answer matches (vLLM's guided_regex). */
static bool text_grammar(serve_request *r, const json_t *v, const char *param, const char *what,
                         ts_status (*make)(const char *, size_t, ts_grammar **), serve_error *e) {
    if (!json_is_string(v))
        return serve_fail(e, 400, "invalid_value", param, "'%s' must be %s (a string)", param,
                          what);
    return take_grammar(make(json_string_value(v), json_string_length(v), &r->grammar), param, e);
}

static bool gbnf_grammar(serve_request *r, const json_t *v, const char *param, serve_error *e) {
    return text_grammar(r, v, param, "a GBNF grammar", ts_grammar_from_gbnf, e);
}

static bool regex_grammar(serve_request *r, const json_t *v, const char *param, serve_error *e) {
    return text_grammar(r, v, param, "a regular expression", ts_grammar_from_regex, e);
}

/* A JSON Schema given as an object, or (vLLM's guided_json may be) as its JSON text. */
static bool schema_grammar(serve_request *r, const json_t *v, const char *param, serve_error *e) {
    if (!json_is_string(v)) return compile_grammar(r, v, param, e);
    json_error_t err;
    json_t *schema = json_loads(json_string_value(v), JSON_REJECT_DUPLICATES, &err);
    if (!schema)
        return serve_fail(e, 400, "invalid_value", param, "'%s' is not a JSON Schema: %s", param,
                          err.text);
    bool ok = compile_grammar(r, schema, param, e);
    json_decref(schema);
    return ok;
}

/* What other servers call a constrained answer, so that their clients get one here too
 * rather than an unconstrained answer: llama-server's json_schema (a schema) and grammar
 * (GBNF); vLLM's guided_json (a schema), guided_choice (one of the strings), guided_grammar
 * (GBNF), guided_regex (text the expression matches whole) and structured_outputs ({"json" |
 * "choice" | "grammar" | "regex" | "json_object": ...}). One constraint a request: a second is
 * refused, not picked. */
static bool parse_other_constraints(serve_request *r, const json_t *o, serve_error *e) {
    static const char *const names[] = {"json_schema",       "grammar",        "guided_json",
                                        "guided_choice",     "guided_grammar", "guided_regex",
                                        "structured_outputs"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        const char *f = names[k];
        const json_t *v = field(o, f);
        if (!v) continue;
        if (r->grammar)
            return serve_fail(e, 400, "invalid_value", f,
                              "'%s' and another constraint "
                              "(response_format, json_schema, grammar, guided_*) in one request",
                              f);
        bool ok;
        if (strcmp(f, "json_schema") == 0 || strcmp(f, "guided_json") == 0) {
            ok = schema_grammar(r, v, f, e);
        } else if (strcmp(f, "grammar") == 0 || strcmp(f, "guided_grammar") == 0) {
            ok = gbnf_grammar(r, v, f, e);
        } else if (strcmp(f, "guided_choice") == 0) {
            ok = choice_grammar(r, v, f, e);
        } else if (strcmp(f, "guided_regex") == 0) {
            ok = regex_grammar(r, v, f, e);
        } else { /* structured_outputs: exactly one of its kinds */
            const char *kind = NULL;
            const json_t *kv = NULL;
            size_t n_kinds = 0;
            const char *key;
            json_t *val;
            if (!json_is_object(v))
                return serve_fail(e, 400, "invalid_value", f, "'%s' must be an object", f);
            json_object_foreach((json_t *)v, key, val) {
                if (json_is_null(val) || strcmp(key, "disable_any_whitespace") == 0 ||
                    strcmp(key, "disable_fallback") == 0 || strcmp(key, "whitespace_pattern") == 0)
                    continue;
                kind = key, kv = val, n_kinds++;
            }
            char param[64];
            snprintf(param, sizeof param, "structured_outputs.%s", kind ? kind : "");
            if (n_kinds != 1)
                ok = serve_fail(e, 400, "invalid_value", f,
                                "'structured_outputs' needs exactly "
                                "one of json, choice, grammar, regex, json_object");
            else if (strcmp(kind, "json") == 0)
                ok = schema_grammar(r, kv, param, e);
            else if (strcmp(kind, "choice") == 0)
                ok = choice_grammar(r, kv, param, e);
            else if (strcmp(kind, "grammar") == 0)
                ok = gbnf_grammar(r, kv, param, e);
            else if (strcmp(kind, "regex") == 0)
                ok = regex_grammar(r, kv, param, e);
            else if (strcmp(kind, "json_object") == 0 && json_is_true(kv))
                ok = compile_grammar(r, NULL, param, e);
            else
                ok = serve_fail(e, 400, "unsupported_feature", param, "'%s' is not supported",
                                param);
        }
        if (!ok) return false;
    }
    return true;
}

static bool parse_chat_extras(serve_request *r, const json_t *o, serve_error *e) {
    if (!parse_response_format(r, o, e) || !parse_other_constraints(r, o, e)) return false;
    const json_t *kw = field(o, "chat_template_kwargs");
    if (kw && !json_is_object(kw))
        return serve_fail(e, 400, "invalid_value", "chat_template_kwargs",
                          "'chat_template_kwargs' must be an object");
    r->enable_thinking = -1;
    const json_t *re = field(o, "reasoning_effort");
    if (re) {
        int idx = -1;
        for (int i = 0; json_is_string(re) && i < SERVE_EFFORTS; i++)
            if (strcmp(json_string_value(re), serve_effort_names[i]) == 0) idx = i;
        if (idx < 0)
            return serve_fail(e, 400, "invalid_value", "reasoning_effort",
                              "'reasoning_effort' must be none, minimal, low, medium or high");
        if (idx == SERVE_EFFORT_NONE) r->enable_thinking = 0;
        r->effort = idx;
    }
    const json_t *rf = field(o, "reasoning_format");
    if (rf) {
        int inl = serve_reasoning_format(json_is_string(rf) ? json_string_value(rf) : "");
        if (inl < 0)
            return serve_fail(e, 400, "invalid_value", "reasoning_format",
                              "'reasoning_format' must be none (the thinking left in the "
                              "content), deepseek or auto (apart, as reasoning_content)");
        r->reasoning_inline = inl;
    }
    if (kw) {
        bool on = false;
        if (!get_bool(kw, "enable_thinking", &on, e)) {
            snprintf(e->param, sizeof e->param, "chat_template_kwargs.enable_thinking");
            return false;
        }
        if (field(kw, "enable_thinking")) r->enable_thinking = on;
    }
    /* vLLM's: continue the final message (as transformers renders it), or no generation
     * prompt; the latter defaults to the opposite of the former */
    if (!get_bool(o, "continue_final_message", &r->continue_final, e)) return false;
    r->add_generation_prompt = !r->continue_final;
    if (!get_bool(o, "add_generation_prompt", &r->add_generation_prompt, e)) return false;
    if (r->add_generation_prompt && r->continue_final)
        return serve_fail(e, 400, "invalid_value", "add_generation_prompt",
                          "continue_final_message and add_generation_prompt cannot both be true: "
                          "the one continues the final message, the other starts a new one");
    return true;
}

/* tools: [{type: "function", function: {name, description, parameters}}], rendered into the
 * system turn as given; tool_choice "auto" (the default) or "none" (calls are not parsed). */
static bool parse_tools(serve_request *r, const json_t *o, serve_error *e) {
    const json_t *tools = field(o, "tools"), *choice = field(o, "tool_choice");
    if (tools) {
        if (!json_is_array(tools))
            return serve_fail(e, 400, "invalid_value", "tools", "'tools' must be a list");
        size_t k;
        const json_t *t;
        json_array_foreach(tools, k, t) {
            char param[48];
            snprintf(param, sizeof param, "tools[%zu]", k);
            const json_t *type = json_is_object(t) ? json_object_get(t, "type") : NULL;
            if (!json_is_string(type))
                return serve_fail(e, 400, "invalid_value", param, "%s must be an object with a "
                                  "'type'", param);
            if (strcmp(json_string_value(type), "function") != 0)
                return serve_fail(e, 400, "unsupported_feature", param, "%s: only 'function' "
                                  "tools are supported", param);
            const json_t *fn = json_object_get(t, "function");
            const json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
            if (!json_is_string(name) || json_string_length(name) == 0) {
                snprintf(param, sizeof param, "tools[%zu].function.name", k);
                return serve_fail(e, 400, "invalid_value", param, "%s must be a non-empty "
                                  "string", param);
            }
            const json_t *params = json_object_get(fn, "parameters");
            if (params && !json_is_null(params) && !json_is_object(params)) {
                snprintf(param, sizeof param, "tools[%zu].function.parameters", k);
                return serve_fail(e, 400, "invalid_value", param, "%s must be a JSON Schema "
                                  "object", param);
            }
        }
        if (json_array_size(tools) > 0) {
            r->tools_json = json_dumps(tools, JSON_COMPACT);
            if (!r->tools_json) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
        }
    }
    bool none = false, required = false;
    const char *only = NULL; /* a named function */
    if (json_is_object(choice)) {
        const json_t *type = json_object_get(choice, "type");
        const json_t *fn = json_object_get(choice, "function");
        const json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0 ||
            !json_is_string(name))
            return serve_fail(e, 400, "invalid_value", "tool_choice",
                              "a named 'tool_choice' is "
                              "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        only = json_string_value(name);
        required = true;
    } else if (choice) {
        if (!json_is_string(choice) || (strcmp(json_string_value(choice), "auto") != 0 &&
                                        strcmp(json_string_value(choice), "none") != 0 &&
                                        strcmp(json_string_value(choice), "required") != 0))
            return serve_fail(e, 400, "invalid_value", "tool_choice", "'tool_choice' must be "
                              "'auto', 'none', 'required' or a named function");
        none = strcmp(json_string_value(choice), "none") == 0;
        required = strcmp(json_string_value(choice), "required") == 0;
    }
    bool parallel = true;
    if (!get_bool(o, "parallel_tool_calls", &parallel, e)) return false;
    if (required) { /* the answer must be calls: a grammar of them */
        if (!r->tools_json)
            return serve_fail(e, 400, "invalid_value", "tool_choice",
                              "tool_choice '%s' needs "
                              "'tools'",
                              only ? "function" : "required");
        if (r->grammar)
            return serve_fail(e, 400, "unsupported_feature", "tool_choice",
                              "tool_choice "
                              "'required' or a named function together with a JSON "
                              "response_format is not supported");
        ts_status st = ts_grammar_tool_calls(r->tools_json, only, parallel, &r->grammar);
        if (st == TS_ERR_NOMEM) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
        if (st != TS_OK)
            return serve_fail(e, 400, "invalid_value",
                              only ? "tool_choice.function.name" : "tool_choice", "%s",
                              ts_last_error());
    }
    r->parse_tools = r->tools_json && !none;
    r->tools_forced = required;
    r->tool_only = only;
    r->tools_parallel = parallel;
    return true;
}

/* OpenAI's Predicted Outputs: {"type": "content", "content": text or a list of text parts},
 * the answer the client expects (most of a file it asks to have edited): the decoder guesses
 * from it (speculative decoding, serve/speculate.c); the answer is the model's either way. */
static bool parse_prediction(serve_request *r, const json_t *o, serve_error *e) {
    const json_t *p = field(o, "prediction");
    if (!p) return true;
    const json_t *type = json_object_get(p, "type"), *c = json_object_get(p, "content");
    if (!json_is_object(p) || !json_is_string(type) ||
        strcmp(json_string_value(type), "content") != 0)
        return serve_fail(e, 400, "invalid_value", "prediction",
                          "'prediction' must be an object with \"type\": \"content\"");
    if (json_is_string(c)) {
        r->prediction = json_string_value(c);
        return true;
    }
    size_t total = 1, k;
    const json_t *part;
    if (!json_is_array(c))
        return serve_fail(e, 400, "invalid_value", "prediction.content",
                          "prediction.content must be a string or a list of text parts");
    json_array_foreach(c, k, part) {
        const json_t *t = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0 ||
            !json_is_string(text))
            return serve_fail(e, 400, "invalid_value", "prediction.content",
                              "prediction.content[%zu] must be a text part with a string 'text'",
                              k);
        total += json_string_length(text);
    }
    r->prediction = join_text(r, c, total);
    return r->prediction ? true : serve_fail(e, 500, "internal_error", NULL, "out of memory");
}

const char *const serve_effort_names[SERVE_EFFORTS] = {"none", "minimal", "low", "medium", "high"};

int serve_reasoning_format(const char *s) {
    if (!strcmp(s, "none")) return 1;
    return !strcmp(s, "deepseek") || !strcmp(s, "auto") ? 0 : -1;
}

bool serve_check_model(const json_t *root, const char *const *model_ids, const char **model,
                       serve_error *e) {
    *model = NULL;
    const json_t *m = field(root, "model");
    if (!m) return true;
    if (!json_is_string(m))
        return serve_fail(e, 400, "invalid_value", "model", "'model' must be a string");
    bool known = false;
    for (int i = 0; model_ids[i]; i++)
        known |= strcmp(model_ids[i], json_string_value(m)) == 0 || !strcmp(model_ids[i], "*");
    if (known && json_string_length(m) > SERVE_MAX_MODEL_NAME)
        return serve_fail(e, 400, "invalid_value", "model", "'model' is longer than %d bytes (%zu)",
                          SERVE_MAX_MODEL_NAME, json_string_length(m));
    if (!known)
        return serve_fail(e, 404, "model_not_found", "model",
                          "the model '%.100s' does not exist; this server runs '%s'",
                          json_string_value(m), model_ids[0]);
    *model = json_string_value(m);
    return true;
}

bool serve_request_parse(serve_api api, json_t *root, const char *const *model_ids,
                         int max_tokens_cap, serve_request *r, serve_error *e) {
    memset(r, 0, sizeof *r);
    r->api = api;
    r->root = root;
    r->max_tokens = -1;
    r->n = 1;
    r->add_generation_prompt = true;
    r->top_logprobs = -1;
    r->enable_thinking = -1;
    r->effort = -1;
    r->reasoning_inline = -1;
    ts_sampler_params_default(&r->sp);
    if (!serve_check_model(root, model_ids, &r->model, e)) return false;
    if (api == SERVE_API_CHAT ? !parse_messages(r, root, e) : !parse_prompt(r, root, e))
        return false;
    if (!get_bool(root, "stream", &r->stream, e)) return false;
    const json_t *so = field(root, "stream_options");
    if (so) {
        if (!json_is_object(so))
            return serve_fail(e, 400, "invalid_value", "stream_options",
                              "'stream_options' must be an object");
        if (!get_bool(so, "include_usage", &r->include_usage, e)) return false;
    }
    if (!parse_sampling(r, root, max_tokens_cap, e)) return false;
    if (!parse_logprobs(r, root, e)) return false;
    long long n = 1;
    if (!get_int(root, "n", 1, SERVE_MAX_N, &n, e)) return false;
    r->n = r->best_of = (int)n;
    if (!get_bool(root, "ignore_eos", &r->ignore_eos, e)) return false;
    if (!get_bool(root, "return_token_ids", &r->return_token_ids, e)) return false;
    long long min_tokens = 0;
    if (!get_int(root, "min_tokens", 0, INT32_MAX, &min_tokens, e)) return false;
    r->min_tokens = (int)min_tokens;
    long long budget = SERVE_THINK_BUDGET_UNSET;
    if (!get_int(root, "thinking_token_budget", -1, INT32_MAX, &budget, e)) return false;
    r->think_budget = (int)budget;
    if (!parse_stop_ids(r, root, e)) return false;
    if (!get_bool(root, "include_stop_str_in_output", &r->include_stop, e)) return false;
    if (!parse_prediction(r, root, e)) return false;
    const json_t *lora = field(root, "lora");
    if (lora && !serve_lora_parse(lora, "lora", &r->n_lora, r->lora_id, r->lora_scale, e))
        return false;
    r->lora_given = lora != NULL;
    if (api == SERVE_API_CHAT) {
        if (!parse_chat_extras(r, root, e)) return false;
        if (!parse_tools(r, root, e)) return false;
        if (!parse_mm_kwargs(r, root, e)) return false;
        static const char *const unsupported[] = {"functions", "function_call", "audio", NULL};
        if (!refuse_unsupported(root, unsupported, e)) return false;
    } else {
        if (!parse_response_format(r, root, e) || !parse_other_constraints(r, root, e))
            return false;
        const json_t *suffix = field(root, "suffix");
        if (suffix && !json_is_string(suffix))
            return serve_fail(e, 400, "invalid_value", "suffix", "'suffix' must be a string");
        r->suffix = suffix ? json_string_value(suffix) : NULL;
        if (!get_bool(root, "echo", &r->echo, e)) return false;
        if (r->echo && r->suffix)
            return serve_fail(e, 400, "invalid_value", "echo",
                              "echo cannot be combined with suffix (the answer fills a hole "
                              "between the prompt and the suffix)");
        long long best_of = r->n;
        if (!get_int(root, "best_of", 1, SERVE_MAX_N, &best_of, e)) return false;
        if (best_of < r->n)
            return serve_fail(e, 400, "invalid_value", "best_of",
                              "best_of (%lld) must be at least n (%d)", best_of, r->n);
        if (best_of > r->n && r->stream)
            return serve_fail(e, 400, "invalid_value", "best_of",
                              "best_of larger than n cannot be streamed (which answers are "
                              "the best is known only once all are made)");
        r->best_of = (int)best_of;
    }
    r->stop = field(root, "stop");
    return true;
}

/* Calls f on the address of each string the messages borrow from the JSON tree (NULL ones
 * included): content, reasoning, the text parts' and the tool calls' strings. The part and
 * call arrays are the request's own, so their strings can be re-pointed. */
static void each_message_string(serve_request *r, void (*f)(const char **, void *), void *arg) {
    for (int i = 0; i < r->n_msgs; i++) {
        ts_chat_message *m = &r->msgs[i];
        f(&m->content, arg);
        f(&m->reasoning_content, arg);
        ts_content_part *parts = (ts_content_part *)m->parts;
        for (int k = 0; k < m->n_parts; k++)
            f(&parts[k].text, arg);
        ts_tool_call *calls = (ts_tool_call *)m->tool_calls;
        for (int k = 0; k < m->n_tool_calls; k++) {
            f(&calls[k].name, arg);
            f(&calls[k].arguments_json, arg);
        }
    }
}

static void count_string(const char **s, void *bytes) {
    if (*s) *(size_t *)bytes += strlen(*s) + 1;
}

/* Copies *s to *at (a char ** cursor) and points *s there. */
static void copy_string(const char **s, void *at) {
    if (!*s) return;
    char **cur = at;
    size_t n = strlen(*s) + 1;
    *s = memcpy(*cur, *s, n);
    *cur += n;
}

ts_status serve_request_detach(serve_request *r) {
    size_t bytes = 1; /* never malloc(0) */
    each_message_string(r, count_string, &bytes);
    char *at = own(r, malloc(bytes));
    if (!at) return ts_error(TS_ERR_NOMEM, "out of memory");
    each_message_string(r, copy_string, &at);
    for (int i = 0; i < r->n_images; i++) {
        free(r->images[i].data);
        r->images[i].data = NULL;
    }
    r->n_images = 0;
    json_decref(r->root);
    r->root = NULL;
    r->model = NULL;
    r->stop = NULL;
    r->prediction = NULL; /* tokenized by preparation */
    r->tool_only = NULL;
    return TS_OK;
}

void serve_request_free(serve_request *r) {
    for (int i = 0; i < r->n_images; i++)
        free(r->images[i].data);
    for (int i = 0; i < r->n_owned; i++) free(r->owned[i]);
    free(r->owned);
    free(r->tools_json);
    ts_grammar_free(r->grammar);
    free(r->msgs);
    serve_prompts_free(r->prompts, r->n_prompts);
    free(r->logit_bias);
    free(r->stop_ids);
    json_decref(r->root);
    memset(r, 0, sizeof *r);
}
