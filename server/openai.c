/* OpenAI's JSON: requests are parsed and validated here (every field checked, errors naming it),
 * responses and stream chunks built here. No HTTP and no threads. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tokenizer/chat.h"
#include "../core/error.h"
#include "../loaders/json_strict.h"
#include "internal.h"

enum { MAX_MESSAGES = 1024, MAX_DETOKENIZE = 131072 };

static int fail(api_error *e, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    e->status = status;
    e->type = status == 404 ? "not_found_error" : status >= 500 ? "server_error" : "invalid_request_error";
    return -1;
}

char *openai_error_json(const api_error *e) {
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type);
    cJSON_AddNumberToObject(err, "code", e->status);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

const char *openai_finish_reason(qlm_stop_reason r) {
    return r == QLM_STOP_LENGTH || r == QLM_STOP_CONTEXT ? "length" : "stop";
}

static cJSON *parse_object(const char *body, size_t len, api_error *e) {
    cJSON *root = qlm_json_parse_strict(body, len);
    if (!root) {
        fail(e, 400, "the body is not acceptable JSON: %s", qlm_last_error());
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        fail(e, 400, "the body is not a JSON object");
        return NULL;
    }
    return root;
}

/* A number field within [lo, hi] (integer when whole); absent leaves *out. */
static int number_field(const cJSON *root, const char *name, double lo, double hi, int whole, double *out,
                        api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi ||
        (whole && v->valuedouble != floor(v->valuedouble)))
        return fail(e, 400, "'%s' must be %s in [%g, %g]", name, whole ? "an integer" : "a number", lo, hi);
    *out = v->valuedouble;
    return 0;
}

/* The adapter the request names through "model" (vLLM's way) or "adapter"; "" for the base. Only
 * the name is taken here: http.c looks it up under the registry's lock. */
static int pick_adapter(const qlm_server_config *cfg, const cJSON *root, job *j, char *model_id, size_t cap,
                        api_error *e) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *adapter = cJSON_GetObjectItemCaseSensitive(root, "adapter");
    if (model && !cJSON_IsNull(model) && !cJSON_IsString(model)) return fail(e, 400, "'model' must be a string");
    if (adapter && !cJSON_IsNull(adapter) && !cJSON_IsString(adapter)) return fail(e, 400, "'adapter' must be a string");
    const char *name = cJSON_IsString(model) ? model->valuestring : cfg->model_name;
    snprintf(model_id, cap, "%s", name);
    const char *want = strcmp(name, cfg->model_name) != 0 ? name : "";
    j->adapter_via_model = want[0] != 0;
    if (cJSON_IsString(adapter)) {
        want = strcmp(adapter->valuestring, "none") != 0 ? adapter->valuestring : "";
        j->adapter_via_model = 0;
    }
    if (strlen(want) >= sizeof j->adapter_name)
        return fail(e, 404, "the %s '%.64s...' does not exist", j->adapter_via_model ? "model" : "adapter", want);
    snprintf(j->adapter_name, sizeof j->adapter_name, "%s", want);
    return 0;
}

int openai_find_adapter(const qlm_server_config *cfg, const job *j, const qlm_lora_adapter **out, api_error *e) {
    *out = NULL;
    if (!j->adapter_name[0]) return 0;
    if (!(*out = cfg->lora ? qlm_lora_registry_find(cfg->lora, j->adapter_name) : NULL))
        return fail(e, 404, "the %s '%s' does not exist", j->adapter_via_model ? "model" : "adapter", j->adapter_name);
    return 0;
}

int openai_parse_adapter_load(const qlm_server_config *cfg, const char *body, size_t len, char *name, size_t name_cap,
                              char **path, api_error *e) {
    *path = NULL;
    cJSON *root = parse_object(body, len, e);
    if (!root) return -1;
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(root, "name");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "path");
    int rc = -1;
    /* qlm_lora_load's rule, checked here so the error names the field. */
    size_t nl = cJSON_IsString(n) ? strlen(n->valuestring) : 0;
    int ok = nl >= 1 && nl <= 63 && nl < name_cap && strcmp(n->valuestring, "none") != 0;
    for (size_t i = 0; ok && i < nl; i++) {
        char c = n->valuestring[i];
        ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
    }
    if (!ok) fail(e, 400, "'name' must be 1-63 letters, digits, '_', '-' or '.', and not \"none\"");
    else if (!strcmp(n->valuestring, cfg->model_name)) fail(e, 409, "'name' is the base model's id");
    else if (!cJSON_IsString(p) || !p->valuestring[0]) fail(e, 400, "'path' must be a non-empty string");
    else if (!(*path = strdup(p->valuestring))) fail(e, 500, "out of memory");
    else {
        memcpy(name, n->valuestring, nl + 1);
        rc = 0;
    }
    cJSON_Delete(root);
    return rc;
}

static int parse_stop(const cJSON *root, job *j, api_error *e) {
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (!stop || cJSON_IsNull(stop)) return 0;
    int n = cJSON_IsString(stop) ? 1 : cJSON_IsArray(stop) ? cJSON_GetArraySize(stop) : -1;
    if (n < 0 || n > JOB_MAX_STOP) return fail(e, 400, "'stop' must be a string or a list of up to %d strings", JOB_MAX_STOP);
    for (int i = 0; i < n; i++) {
        const cJSON *s = cJSON_IsString(stop) ? stop : cJSON_GetArrayItem(stop, i);
        if (!cJSON_IsString(s) || !s->valuestring[0]) return fail(e, 400, "'stop' entries must be non-empty strings");
        if (!(j->stop[i] = strdup(s->valuestring))) return fail(e, 500, "out of memory");
        j->params.n_stop = i + 1;
    }
    return 0;
}

static int known_role(const char *r) {
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    for (size_t i = 0; i < sizeof roles / sizeof *roles; i++)
        if (!strcmp(r, roles[i])) return 1;
    return 0;
}

/* One message as the official clients send it: content a string, a list of text parts (joined with
 * newlines, as vLLM does), or null on an assistant turn; a participant's name is accepted (the
 * templates do not show it). Anything that is not text is refused rather than dropped. */
static int message_text(const cJSON *msg, int i, qlm_chat_message *out, char **owned, api_error *e) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    if (!cJSON_IsObject(msg) || !cJSON_IsString(role)) return fail(e, 400, "'messages[%d]' needs a string 'role'", i);
    if (!known_role(role->valuestring))
        return fail(e, 400, "'messages[%d].role' must be system, user, assistant or tool", i);
    const cJSON *f;
    cJSON_ArrayForEach(f, msg) {
        if (!strcmp(f->string, "role") || !strcmp(f->string, "content")) continue;
        if ((!strcmp(f->string, "name") || !strcmp(f->string, "tool_call_id")) && cJSON_IsString(f)) continue;
        if (!strcmp(f->string, "tool_calls") && cJSON_IsArray(f) && !f->child) continue;
        return fail(e, 400, "'messages[%d].%.64s' is not supported by this server", i, f->string);
    }
    out->role = role->valuestring;
    if (cJSON_IsString(content)) {
        out->content = content->valuestring;
        return 0;
    }
    if (cJSON_IsNull(content) && !strcmp(role->valuestring, "assistant")) {
        out->content = "";
        return 0;
    }
    if (!cJSON_IsArray(content))
        return fail(e, 400, "'messages[%d].content' must be a string or a list of text parts", i);
    size_t len = 0;
    int j = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, content) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0)
            return fail(e, 400, "'messages[%d].content[%d]' is a%s '%.32s' part: this model reads text only", i, j,
                        cJSON_IsString(type) ? "" : "n untyped", cJSON_IsString(type) ? type->valuestring : "?");
        if (!cJSON_IsString(t)) return fail(e, 400, "'messages[%d].content[%d].text' must be a string", i, j);
        len += strlen(t->valuestring) + 1;
        j++;
    }
    if (!(*owned = malloc(len + 1))) return fail(e, 500, "out of memory");
    size_t at = 0;
    cJSON_ArrayForEach(part, content) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        at += (size_t)sprintf(*owned + at, "%s%s", at ? "\n" : "", t);
    }
    (*owned)[at] = 0;
    out->content = *owned;
    return 0;
}

/* The chat prompt in the model's template (qlm_chat_render's plain fallback when it has none),
 * with what the messages say marked so that it is never read as control tokens. */
static int render_chat(const qlm_server_config *cfg, const cJSON *root, qlm_marked_text *text, api_error *e) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    int n = cJSON_IsArray(msgs) ? cJSON_GetArraySize(msgs) : -1;
    if (n < 1 || n > MAX_MESSAGES) return fail(e, 400, "'messages' must be a list of 1 to %d messages", MAX_MESSAGES);
    qlm_chat_message *m = calloc((size_t)n, sizeof *m);
    char **owned = calloc((size_t)n, sizeof *owned);
    int i = 0, rc = -1;
    if (!m || !owned) {
        fail(e, 500, "out of memory");
        goto done;
    }
    const cJSON *msg;
    cJSON_ArrayForEach(msg, msgs) {
        if (message_text(msg, i, &m[i], &owned[i], e) != 0) goto done;
        i++;
    }
    int bos = qlm_tokenizer_bos(cfg->tok), eos = qlm_tokenizer_eos(cfg->tok);
    rc = qlm_chat_render_marked(qlm_tokenizer_chat_template(cfg->tok), m, n, 1,
                                bos >= 0 ? qlm_tokenizer_token(cfg->tok, bos) : "",
                                eos >= 0 ? qlm_tokenizer_token(cfg->tok, eos) : "", text);
    if (rc != 0) fail(e, 400, "'messages' do not fit the model's chat template: %s", qlm_last_error());
done:
    for (int k = 0; owned && k < n; k++) free(owned[k]);
    free(owned);
    free(m);
    return rc != 0 ? -1 : 0;
}

/* Completions: "logprobs": N alternatives (0..20). Chat: "logprobs": true, "top_logprobs": N. */
static int parse_logprobs(const cJSON *root, int chat, job *j, api_error *e) {
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
    double top = 0;
    if (chat) {
        if (lp && !cJSON_IsNull(lp) && !cJSON_IsBool(lp)) return fail(e, 400, "'logprobs' must be true or false");
        if (number_field(root, "top_logprobs", 0, QLM_MAX_TOP_LOGPROBS, 1, &top, e) != 0) return -1;
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "top_logprobs");
        if (t && !cJSON_IsNull(t) && !cJSON_IsTrue(lp)) return fail(e, 400, "'top_logprobs' needs 'logprobs': true");
        j->logprobs = cJSON_IsTrue(lp);
    } else {
        if (lp && !cJSON_IsNull(lp) && !cJSON_IsFalse(lp)) {
            if (number_field(root, "logprobs", 0, QLM_MAX_TOP_LOGPROBS, 1, &top, e) != 0) return -1;
            j->logprobs = 1;
        }
    }
    if (j->logprobs) j->params.top_logprobs = (int)top;
    return 0;
}

/* Whether v is the value by which a client says it does not want a feature (clients send such
 * defaults), for the fields of OpenAI's API that qlm does not implement. */
static int feature_off(const cJSON *v) {
    const char *k = v->string;
    if (cJSON_IsNull(v)) return 1;
    if (!strcmp(k, "echo") || !strcmp(k, "store") || !strcmp(k, "parallel_tool_calls"))
        return cJSON_IsFalse(v) || (!strcmp(k, "parallel_tool_calls") && cJSON_IsTrue(v));
    if (!strcmp(k, "presence_penalty") || !strcmp(k, "frequency_penalty") || !strcmp(k, "min_p"))
        return cJSON_IsNumber(v) && v->valuedouble == 0;
    if (!strcmp(k, "best_of")) return cJSON_IsNumber(v) && v->valuedouble == 1;
    if (!strcmp(k, "logit_bias")) return cJSON_IsObject(v) && !v->child;
    if (!strcmp(k, "tools")) return cJSON_IsArray(v) && !v->child;
    if (!strcmp(k, "tool_choice")) return cJSON_IsString(v) && !strcmp(v->valuestring, "none");
    return 0;
}

static int listed(const char *name, const char *const *names) {
    for (; *names; names++)
        if (!strcmp(name, *names)) return 1;
    return 0;
}

/* A field qlm does not act on is refused, naming it, rather than answered as if it had been
 * honoured; unknown fields too, as OpenAI's API does. */
static int check_fields(const cJSON *root, int chat, api_error *e) {
    static const char *const both[] = {"model", "adapter", "max_tokens", "temperature", "top_p", "top_k", "seed",
                                       "n", "stop", "stream", "stream_options", "user", "repetition_penalty",
                                       "logprobs", "presence_penalty", "frequency_penalty", "min_p", "logit_bias",
                                       "response_format", NULL};
    static const char *const chat_only[] = {"messages", "max_completion_tokens", "top_logprobs", NULL};
    static const char *const completion_only[] = {"prompt", "echo", NULL};
    static const char *const not_implemented[] = {
        "best_of", "suffix", "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call",
        "store", "metadata", "service_tier", "modalities", "audio", "prediction", "reasoning_effort", NULL};
    /* vLLM's chat "echo" (repeat the last message) is no field of OpenAI's chat, and not implemented. */
    static const char *const chat_not_implemented[] = {"echo", NULL};
    const cJSON *f;
    cJSON_ArrayForEach(f, root) {
        if (listed(f->string, both) || listed(f->string, chat ? chat_only : completion_only)) continue;
        if (listed(f->string, not_implemented) || (chat && listed(f->string, chat_not_implemented))) {
            if (feature_off(f)) continue;
            return fail(e, 400, "'%s' is not supported by this server", f->string);
        }
        return fail(e, 400, "unrecognized request field '%.64s'", f->string);
    }
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(so, "include_usage");
        if (!cJSON_IsObject(so) || cJSON_GetArraySize(so) != (u != NULL) || (u && !cJSON_IsBool(u)))
            return fail(e, 400, "'stream_options' takes only {\"include_usage\": true|false}");
    }
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(root, "user");
    if (user && !cJSON_IsNull(user) && !cJSON_IsString(user)) return fail(e, 400, "'user' must be a string");
    return 0;
}

/* OpenAI's logit_bias: {"token id": bias in [-100, 100], ...} for ids of the vocabulary. */
static int parse_logit_bias(const qlm_server_config *cfg, const cJSON *root, job *j, api_error *e) {
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(root, "logit_bias"), *f;
    if (!lb || cJSON_IsNull(lb)) return 0;
    if (!cJSON_IsObject(lb)) return fail(e, 400, "'logit_bias' must be an object of token ids to biases");
    int n = cJSON_GetArraySize(lb), k = 0, vocab = cfg->t5 ? cfg->t5->cfg.vocab_size : cfg->model->cfg.vocab_size;
    if (n > vocab) return fail(e, 400, "'logit_bias' has more entries than the vocabulary has tokens");
    j->logit_bias = malloc((size_t)(n ? n : 1) * sizeof *j->logit_bias);
    if (!j->logit_bias) return fail(e, 500, "out of memory");
    cJSON_ArrayForEach(f, lb) {
        char *end;
        errno = 0;
        long id = strtol(f->string, &end, 10);
        if (errno || end == f->string || *end || id < 0 || id >= vocab)
            return fail(e, 400, "'logit_bias' key '%.32s' is not a token id of this model (0..%d)", f->string, vocab - 1);
        if (!cJSON_IsNumber(f) || !(fabs(f->valuedouble) <= 100))
            return fail(e, 400, "'logit_bias' value of token %ld must be a number in [-100, 100]", id);
        j->logit_bias[k++] = (qlm_logit_bias){.token = (int)id, .bias = (float)f->valuedouble};
    }
    j->params.sampling.logit_bias = j->logit_bias;
    j->params.sampling.n_logit_bias = k;
    return 0;
}

/* The name OpenAI requires: 1 to 64 letters, digits, '_' or '-'. */
static int schema_name_ok(const cJSON *name) {
    size_t n = cJSON_IsString(name) ? strlen(name->valuestring) : 0;
    if (n < 1 || n > 64) return 0;
    return strspn(name->valuestring, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == n;
}

/* response_format.json_schema: {name, description, schema, strict}, the schema compiled into *out. */
static int parse_json_schema(const cJSON *js, qlm_json_grammar **out, api_error *e) {
    static const char *const fields[] = {"name", "description", "schema", "strict", NULL};
    const char *at = "'response_format.json_schema";
    if (!cJSON_IsObject(js)) return fail(e, 400, "%s' must be an object", at);
    const cJSON *f, *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    const cJSON *desc = cJSON_GetObjectItemCaseSensitive(js, "description");
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    cJSON_ArrayForEach(f, js) {
        if (!listed(f->string, fields)) return fail(e, 400, "%s.%.64s' is not supported", at, f->string);
    }
    if (!schema_name_ok(cJSON_GetObjectItemCaseSensitive(js, "name")))
        return fail(e, 400, "%s.name' must be 1 to 64 letters, digits, '_' or '-'", at);
    if (desc && !cJSON_IsString(desc)) return fail(e, 400, "%s.description' must be a string", at);
    if (strict && !cJSON_IsBool(strict) && !cJSON_IsNull(strict)) return fail(e, 400, "%s.strict' must be true or false", at);
    if (!cJSON_IsObject(schema)) return fail(e, 400, "%s.schema' must be a JSON Schema object", at);
    if (!(*out = qlm_json_grammar_schema(schema))) return fail(e, 400, "%s.schema': %s", at, qlm_last_error());
    return 0;
}

/* OpenAI's response_format: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema",
 * "json_schema": {...}}; the output is then held to one such JSON value (job.json). */
static int parse_response_format(const cJSON *root, const qlm_json_vocab *vocab, job *j, api_error *e) {
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(root, "response_format"), *f;
    if (!rf || cJSON_IsNull(rf)) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    int schema = !strcmp(t, "json_schema");
    if (!cJSON_IsObject(rf) || (strcmp(t, "text") && strcmp(t, "json_object") && !schema))
        return fail(e, 400, "'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}");
    cJSON_ArrayForEach(f, rf) {
        if (strcmp(f->string, "type") && !(schema && !strcmp(f->string, "json_schema")))
            return fail(e, 400, "'response_format.%.64s' is not a field of the %s format", f->string, t);
    }
    if (!strcmp(t, "text")) return 0;
    if (schema) {
        if (parse_json_schema(cJSON_GetObjectItemCaseSensitive(rf, "json_schema"), &j->json, e) != 0) return -1;
    } else if (!(j->json = qlm_json_grammar_object())) {
        return fail(e, 500, "out of memory");
    }
    if (qlm_json_vocab_check(vocab, j->json) != 0) return fail(e, 400, "'response_format': %s", qlm_last_error());
    j->params.json = j->json;
    j->params.json_vocab = vocab;
    return 0;
}

/* Completions' echo: true makes every choice's text start with the prompt (j->echo). The prompt's
 * log-probabilities come from the decoder's prefill, which a T5 prompt, the encoder's input, has not. */
static int parse_echo(const qlm_server_config *cfg, const cJSON *root, const char *prompt, job *j, api_error *e) {
    const cJSON *echo = cJSON_GetObjectItemCaseSensitive(root, "echo");
    if (echo && !cJSON_IsNull(echo) && !cJSON_IsBool(echo)) return fail(e, 400, "'echo' must be true or false");
    if (!cJSON_IsTrue(echo)) return 0;
    if (j->logprobs && cfg->t5)
        return fail(e, 400, "'echo' with 'logprobs' needs a decoder-only model: a T5 prompt is the encoder's input, "
                            "which has no log-probabilities");
    if (!(j->echo = strdup(prompt))) return fail(e, 500, "out of memory");
    return 0;
}

/* The seed of a request's first choice; choice i takes this + i, so that with a request seed s it
 * gets what a request with seed s + i gets alone. Without one the clock picks it here, once, as
 * samplers that each read the clock at once could draw alike. */
static uint64_t first_seed(double seed) {
    if (seed >= 0) return (uint64_t)seed;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Gives j its n choices, each with its own seed (first_seed). */
static int add_choices(job *j, int n, double seed, api_error *e) {
    if (job_add_choices(j, n) != 0) return fail(e, 500, "out of memory");
    uint64_t first = first_seed(seed);
    for (int i = 0; i < n; i++) {
        /* The sampler takes 0 for "from the clock": 0 gets a fixed stand-in, so that it repeats like
         * every other seed (which match `qlm generate --seed`). */
        uint64_t s = first + (uint64_t)i;
        j->choices[i].params.sampling.seed = s ? s : 0x9e3779b97f4a7c15ULL;
    }
    return 0;
}

int openai_parse_generation(const qlm_server_config *cfg, const qlm_json_vocab *json_vocab, const char *body,
                            size_t len, int chat, job *j, char *model_id, size_t model_cap, api_error *e) {
    cJSON *root = parse_object(body, len, e);
    if (!root) return -1;
    int rc = -1;
    qlm_marked_text text = {0};
    double max_tokens = chat ? cfg->max_output : 16, temperature = 1, top_p = 1, top_k = 0, n = 1, seed = -1;
    double repetition = 1, presence = 0, frequency = 0, min_p = 0;
    if (check_fields(root, chat, e) != 0 || pick_adapter(cfg, root, j, model_id, model_cap, e) != 0) goto out;
    if (number_field(root, "max_tokens", 1, cfg->max_output, 1, &max_tokens, e) != 0 ||
        (chat && number_field(root, "max_completion_tokens", 1, cfg->max_output, 1, &max_tokens, e) != 0) ||
        number_field(root, "temperature", 0, 2, 0, &temperature, e) != 0 ||
        number_field(root, "top_p", 1e-6, 1, 0, &top_p, e) != 0 || number_field(root, "top_k", 0, 1e9, 1, &top_k, e) != 0 ||
        number_field(root, "seed", 0, 9007199254740991.0, 1, &seed, e) != 0 ||
        number_field(root, "n", 1, JOB_MAX_CHOICES, 1, &n, e) != 0 ||
        number_field(root, "repetition_penalty", 1e-3, 100, 0, &repetition, e) != 0 ||
        number_field(root, "presence_penalty", -2, 2, 0, &presence, e) != 0 ||
        number_field(root, "frequency_penalty", -2, 2, 0, &frequency, e) != 0 ||
        number_field(root, "min_p", 0, 1, 0, &min_p, e) != 0 || parse_stop(root, j, e) != 0)
        goto out;
    if (parse_logprobs(root, chat, j, e) != 0 || parse_response_format(root, json_vocab, j, e) != 0) goto out;
    const cJSON *stream = cJSON_GetObjectItemCaseSensitive(root, "stream");
    if (stream && !cJSON_IsNull(stream) && !cJSON_IsBool(stream)) {
        fail(e, 400, "'stream' must be true or false");
        goto out;
    }
    j->stream = cJSON_IsTrue(stream);
    /* OpenAI's rule: stream_options only with a stream; include_usage adds a last chunk with the usage. */
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so) && !j->stream) {
        fail(e, 400, "'stream_options' is only allowed with 'stream': true");
        goto out;
    }
    j->include_usage = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(so, "include_usage"));
    int add_special = 1;
    if (chat) {
        if (render_chat(cfg, root, &text, e) != 0) goto out;
        add_special = qlm_tokenizer_chat_template(cfg->tok) == NULL; /* a template writes its own BOS */
    } else {
        const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
        if (cJSON_IsArray(prompt) && cJSON_GetArraySize(prompt) == 1) prompt = cJSON_GetArrayItem(prompt, 0);
        if (!cJSON_IsString(prompt)) {
            fail(e, 400, "'prompt' must be a string (or a list of one string)");
            goto out;
        }
        qlm_marked_puts(&text, prompt->valuestring, 1); /* a completion prompt is text throughout */
        if (parse_echo(cfg, root, prompt->valuestring, j, e) != 0) goto out;
    }
    if (text.failed) {
        fail(e, 500, "out of memory");
        goto out;
    }
    if (qlm_tokenizer_encode_marked(cfg->tok, &text, add_special, &j->ids, &j->n_ids) != 0) {
        fail(e, 400, "the prompt cannot be tokenized");
        goto out;
    }
    if (j->n_ids < 1) {
        fail(e, 400, "the prompt is empty");
        goto out;
    }
    if (j->n_ids > cfg->max_prompt) {
        fail(e, 400, "the prompt is %d tokens, longer than the server's limit of %d", j->n_ids, cfg->max_prompt);
        goto out;
    }
    j->params.sampling = qlm_sampling_defaults();
    if (parse_logit_bias(cfg, root, j, e) != 0) goto out;
    j->params.sampling.presence_penalty = (float)presence;
    j->params.sampling.frequency_penalty = (float)frequency;
    j->params.sampling.min_p = (float)min_p;
    j->params.sampling.temperature = (float)temperature;
    j->params.sampling.top_p = (float)top_p;
    j->params.sampling.top_k = (int)top_k;
    /* vLLM's repetition_penalty: every token of the prompt and the output so far. */
    j->params.sampling.repeat_penalty = (float)repetition;
    j->params.sampling.repeat_last_n = cfg->max_prompt + cfg->max_output;
    j->params.max_new_tokens = (int)max_tokens;
    if (add_choices(j, (int)n, seed, e) != 0) goto out;
    rc = 0;
out:
    qlm_marked_free(&text);
    cJSON_Delete(root);
    return rc;
}

/* OpenAI's convention: the prompt counted once, the choices' tokens summed. */
static void add_usage(cJSON *root, const job *j) {
    int generated = job_generated(j), evaluated = 0;
    for (int i = 0; i < j->n_choices; i++)
        if (j->choices[i].stats.n_prompt > evaluated) evaluated = j->choices[i].stats.n_prompt;
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", j->n_ids);
    cJSON_AddNumberToObject(u, "completion_tokens", generated);
    cJSON_AddNumberToObject(u, "total_tokens", j->n_ids + generated);
    /* The prompt's prefix whose keys and values came from an earlier request's cache: what no
     * choice evaluated (the choices after the first copy it from the first's). */
    cJSON *details = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(details, "cached_tokens", j->n_ids - evaluated);
}

static cJSON *envelope(const openai_reply *r, int chunk) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", r->id);
    cJSON_AddStringToObject(root, "object",
                            r->chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)r->created);
    cJSON_AddStringToObject(root, "model", r->model);
    return root;
}

/* prefix (an echo's prompt, or "") then text, NUL-terminated as cJSON needs: generated text can
 * hold a NUL byte only if the model emits one, which JSON would carry as \u0000 but cJSON cannot,
 * so such text is cut there. */
static char *joined(const char *prefix, const char *text, size_t len) {
    size_t n = strlen(prefix);
    char *s = malloc(n + len + 1);
    if (s) {
        memcpy(s, prefix, n);
        if (len) memcpy(s + n, text, len);
        s[n + len] = 0;
    }
    return s;
}

/* The prev that spells a token as it reads inside a text: any token but BOS (after -1 or BOS,
 * some tokenizers drop a leading space). */
static int mid_text(const qlm_tokenizer *tok) {
    return qlm_tokenizer_bos(tok) == 0 ? 1 : 0;
}

/* A token as the text spells it after prev. *len 0 when it adds no text. */
static const char *spell(const qlm_tokenizer *tok, int prev, int id, char *buf, int cap, int *len) {
    int n = qlm_tokenizer_piece(tok, prev, id, buf, cap - 1);
    *len = n > 0 ? n : 0;
    buf[*len] = 0;
    return buf;
}

static cJSON *byte_list(const char *s, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)s[i]));
    return a;
}

/* Chat's {"token", "logprob", "bytes"} of one token. */
static cJSON *chat_token(const qlm_tokenizer *tok, qlm_token_logprob t) {
    char buf[256];
    int n;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "token", spell(tok, mid_text(tok), t.id, buf, sizeof buf, &n));
    cJSON_AddNumberToObject(o, "logprob", t.logprob);
    cJSON_AddItemToObject(o, "bytes", byte_list(buf, n));
    return o;
}

/* The completions' parallel lists of a logprobs object. */
typedef struct {
    cJSON *tokens, *token_logprobs, *top_logprobs, *text_offset;
} completion_lists;

/* Token id (spelled after prev) at offset into the lists, with its log-probability and
 * alternatives, or nulls when lp is NULL (a prompt's first token, which nothing predicts). Returns
 * the bytes it spells. */
static int add_completion_token(const completion_lists *l, const qlm_tokenizer *tok, int prev, int id,
                                const job_logprob *lp, size_t offset) {
    char buf[256];
    int len;
    cJSON_AddItemToArray(l->tokens, cJSON_CreateString(spell(tok, prev, id, buf, sizeof buf, &len)));
    cJSON_AddItemToArray(l->token_logprobs, lp ? cJSON_CreateNumber(lp->chosen.logprob) : cJSON_CreateNull());
    cJSON *alt = lp ? cJSON_CreateObject() : cJSON_CreateNull();
    for (int k = 0; lp && k < lp->n_top; k++) {
        char b2[256];
        int l2;
        cJSON_AddNumberToObject(alt, spell(tok, prev, lp->top[k].id, b2, sizeof b2, &l2), lp->top[k].logprob);
    }
    cJSON_AddItemToArray(l->top_logprobs, alt);
    cJSON_AddItemToArray(l->text_offset, cJSON_CreateNumber((double)offset));
    return len;
}

/* An echo's prompt tokens, from *at, which ends past the prompt's text. */
static void add_prompt_tokens(const completion_lists *l, const qlm_tokenizer *tok, const job *j, size_t *at) {
    size_t offset = *at;
    for (int i = 0; i < j->n_ids; i++) {
        const job_logprob *lp = i > 0 && i <= j->n_prompt_lp ? &j->prompt_lp[i - 1] : NULL;
        offset += (size_t)add_completion_token(l, tok, i ? j->ids[i - 1] : -1, j->ids[i], lp, offset);
    }
    *at += strlen(j->echo);
}

/* The logprobs object of a choice for entries lp[0..n): chat's {"content": [...]}, or the
 * completions' parallel lists, led by the prompt's tokens when echo (its job) is not NULL, as
 * OpenAI gives them. Text offsets start at *at (advanced past the entries); text_len >= 0 keeps
 * only the tokens that start inside the text (a stop string's tokens go with it); -1 keeps all (a
 * stream's chunk). */
static cJSON *logprobs_json(const qlm_tokenizer *tok, int chat, const job *echo, const job_logprob *lp, int n,
                            long text_len, size_t *at) {
    cJSON *o = cJSON_CreateObject();
    cJSON *content = chat ? cJSON_AddArrayToObject(o, "content") : NULL;
    completion_lists l = {0};
    if (!chat) {
        l = (completion_lists){cJSON_AddArrayToObject(o, "tokens"), cJSON_AddArrayToObject(o, "token_logprobs"),
                               cJSON_AddArrayToObject(o, "top_logprobs"), cJSON_AddArrayToObject(o, "text_offset")};
        if (echo) add_prompt_tokens(&l, tok, echo, at);
    }
    for (int i = 0; i < n && !(text_len >= 0 && *at >= (size_t)text_len); i++) {
        if (!chat) {
            *at += (size_t)add_completion_token(&l, tok, mid_text(tok), lp[i].chosen.id, &lp[i], *at);
            continue;
        }
        char buf[256];
        int len;
        spell(tok, mid_text(tok), lp[i].chosen.id, buf, sizeof buf, &len);
        cJSON *t = chat_token(tok, lp[i].chosen);
        cJSON *alt = cJSON_AddArrayToObject(t, "top_logprobs");
        for (int k = 0; k < lp[i].n_top; k++) cJSON_AddItemToArray(alt, chat_token(tok, lp[i].top[k]));
        cJSON_AddItemToArray(content, t);
        *at += (size_t)len;
    }
    if (chat) cJSON_AddNullToObject(o, "refusal");
    return o;
}

/* A choice of the answer: its index, and its text (chat: in the message, or a chunk's delta). */
static cJSON *add_choice(cJSON *choices, const openai_reply *r, int index, const char *text, int chunk, int role) {
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, choice);
    cJSON_AddNumberToObject(choice, "index", index);
    if (r->chat) {
        cJSON *msg = cJSON_AddObjectToObject(choice, chunk ? "delta" : "message");
        if (role) cJSON_AddStringToObject(msg, "role", "assistant");
        cJSON_AddStringToObject(msg, "content", text);
    } else {
        cJSON_AddStringToObject(choice, "text", text);
    }
    return choice;
}

char *openai_result_json(const openai_reply *r, const job *j) {
    cJSON *root = envelope(r, 0), *choices = cJSON_AddArrayToObject(root, "choices");
    for (int i = 0; i < j->n_choices; i++) {
        const job_choice *c = &j->choices[i];
        char *text = joined(j->echo ? j->echo : "", c->text ? c->text : "", c->text ? c->text_len : 0);
        if (!text) {
            cJSON_Delete(root);
            return NULL;
        }
        cJSON *choice = add_choice(choices, r, i, text, 0, 1);
        /* The scheduler has finished with the job, so its entries are final. */
        size_t start = 0, end = (j->echo ? strlen(j->echo) : 0) + c->text_len;
        if (j->logprobs)
            cJSON_AddItemToObject(choice, "logprobs", logprobs_json(r->tok, r->chat, j->echo ? j : NULL, c->lp, c->n_lp,
                                                                    (long)end, &start));
        else cJSON_AddNullToObject(choice, "logprobs");
        cJSON_AddStringToObject(choice, "finish_reason", openai_finish_reason(c->stats.reason));
        free(text);
    }
    add_usage(root, j);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

char *openai_chunk_json(const openai_reply *r, const job_choice *c, const char *text, size_t len,
                        const job_logprob *lp, int n_lp, size_t *lp_offset, int flags) {
    const job *j = c->job;
    const job *echo = (flags & CHUNK_FIRST) && j->echo ? j : NULL;
    char *t = joined(echo ? echo->echo : "", text ? text : "", text ? len : 0);
    if (!t) return NULL;
    cJSON *root = envelope(r, 1);
    cJSON *choice = add_choice(cJSON_AddArrayToObject(root, "choices"), r, c->index, t, 1, flags & CHUNK_FIRST);
    if (n_lp || (echo && j->logprobs))
        cJSON_AddItemToObject(choice, "logprobs", logprobs_json(r->tok, r->chat, echo, lp, n_lp, -1, lp_offset));
    else cJSON_AddNullToObject(choice, "logprobs");
    if (flags & CHUNK_FINISH) cJSON_AddStringToObject(choice, "finish_reason", openai_finish_reason(c->stats.reason));
    else cJSON_AddNullToObject(choice, "finish_reason");
    if (j->include_usage) cJSON_AddNullToObject(root, "usage"); /* as OpenAI's: it comes in the last chunk */
    free(t);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

char *openai_usage_chunk_json(const openai_reply *r, const job *j) {
    cJSON *root = envelope(r, 1);
    cJSON_AddArrayToObject(root, "choices");
    add_usage(root, j);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* A model entry, with vLLM's max_model_len (prompt and output together) and the largest max_tokens
 * a request may ask for (max_completion_tokens, as OpenRouter names it), so that a client such as
 * the chat page can keep its requests within them. */
static void add_model(cJSON *list, const qlm_server_config *cfg, const char *id, const char *parent, long created) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "qlm");
    if (parent) cJSON_AddStringToObject(m, "parent", parent);
    else cJSON_AddNullToObject(m, "parent");
    cJSON_AddNumberToObject(m, "max_model_len", cfg->max_prompt + cfg->max_output);
    cJSON_AddNumberToObject(m, "max_completion_tokens", cfg->max_output);
    cJSON_AddItemToArray(list, m);
}

char *openai_models_json(const qlm_server_config *cfg, long created, const char *id, int *found) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    add_model(data, cfg, cfg->model_name, NULL, created);
    for (int i = 0; cfg->lora && i < cfg->lora->n; i++)
        add_model(data, cfg, qlm_lora_registry_at(cfg->lora, i)->name, cfg->model_name, created);
    const cJSON *out = root, *m;
    if (id) {
        out = NULL;
        cJSON_ArrayForEach(m, data) if (!strcmp(cJSON_GetObjectItemCaseSensitive(m, "id")->valuestring, id)) out = m;
    }
    *found = out != NULL;
    char *s = out ? cJSON_PrintUnformatted(out) : NULL;
    cJSON_Delete(root);
    return s;
}

char *openai_tokenize_json(const qlm_server_config *cfg, const char *body, size_t len, api_error *e) {
    cJSON *root = parse_object(body, len, e);
    if (!root) return NULL;
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    const cJSON *special = cJSON_GetObjectItemCaseSensitive(root, "add_special_tokens");
    char *s = NULL;
    int *ids = NULL, n = 0;
    if (!cJSON_IsString(prompt)) fail(e, 400, "'prompt' must be a string");
    else if (special && !cJSON_IsBool(special)) fail(e, 400, "'add_special_tokens' must be true or false");
    else if (qlm_tokenizer_encode(cfg->tok, prompt->valuestring, strlen(prompt->valuestring), !cJSON_IsFalse(special),
                                  0, &ids, &n) != 0)
        fail(e, 400, "the prompt cannot be tokenized");
    else {
        cJSON *out = cJSON_CreateObject();
        cJSON_AddItemToObject(out, "tokens", cJSON_CreateIntArray(ids, n));
        cJSON_AddNumberToObject(out, "count", n);
        cJSON_AddNumberToObject(out, "max_model_len", cfg->max_prompt + cfg->max_output);
        s = cJSON_PrintUnformatted(out);
        cJSON_Delete(out);
    }
    free(ids);
    cJSON_Delete(root);
    return s;
}

char *openai_detokenize_json(const qlm_server_config *cfg, const char *body, size_t len, api_error *e) {
    cJSON *root = parse_object(body, len, e);
    if (!root) return NULL;
    const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    int n = cJSON_IsArray(tokens) ? cJSON_GetArraySize(tokens) : -1, vocab = qlm_tokenizer_vocab_size(cfg->tok);
    char *s = NULL, *text = NULL;
    size_t text_len = 0;
    int *ids = n > 0 && n <= MAX_DETOKENIZE ? malloc((size_t)n * sizeof *ids) : NULL;
    if (n < 0) fail(e, 400, "'tokens' must be a list of token ids");
    else if (n > MAX_DETOKENIZE) fail(e, 400, "'tokens' holds %d ids, at most %d", n, MAX_DETOKENIZE), n = -1;
    else if (n > 0 && !ids) fail(e, 500, "out of memory");
    /* One walk of the list: cJSON_GetArrayItem(i) walks it from the start each time. */
    int i = 0;
    const cJSON *t;
    if (ids) cJSON_ArrayForEach(t, tokens) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 || t->valuedouble >= vocab) {
            fail(e, 400, "'tokens[%d]' is not a token id in [0, %d)", i, vocab);
            free(ids);
            ids = NULL;
            n = -1;
            break;
        }
        ids[i++] = (int)t->valuedouble;
    }
    if (n >= 0) {
        if (qlm_tokenizer_decode(cfg->tok, ids, n, 0, &text, &text_len) != 0) {
            fail(e, 400, "the tokens cannot be decoded");
        } else {
            cJSON *out = cJSON_CreateObject();
            cJSON_AddStringToObject(out, "prompt", text);
            s = cJSON_PrintUnformatted(out);
            cJSON_Delete(out);
        }
    }
    free(text);
    free(ids);
    cJSON_Delete(root);
    return s;
}
