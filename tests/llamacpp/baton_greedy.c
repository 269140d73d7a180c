/* Greedy decoding with baton's transformer backend, the counterpart of
 * llama_greedy.c for tests/llamacpp/greedy_check.py:
 *
 *   baton_greedy MODEL.gguf ACTIVATIONS STEPS < prompts.txt > greedy.txt
 *
 * ACTIVATIONS is the backend's option `activations` (f32 or q8).  Each
 * input line is a prompt as token ids; each output line gives, per step,
 * the greedy token, the gap between its logit and the second best, and its
 * logit ("ID:GAP:LOGIT"), the same format as llama_greedy.
 *
 * The backend is driven through its ABI as the worker drives it, with a
 * fake context whose tensors are host memory (as tests/unit/test_transformer.c
 * does): a `prefill` item with the prompt (run in chunks of the default
 * prefill_chunk when longer), then one `decode` item per step, each
 * asking for the outputs `token` and `logits`.  Option eos is set to the
 * last id of the vocabulary, which greedy decoding never picks, so no end
 * token stops a sequence before STEPS (llama.cpp's loop has no stop).  The
 * KV cache is f32 (option kv_dtype; the CPU's default is f16), as
 * llama_greedy makes llama.cpp's, so that the two differ in their
 * arithmetic only, not in how they round the cache.
 * Built by `make llamacpp-check` into $(BUILD)/llamacpp/. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/transformer/transformer.h"
#include "tests/unit/fake_ctx.h"

#define MAX_PROMPT 1024
#define MAX_ALLOCS 16

/* The fake context of one item: what it allocated and produced. */
typedef struct fake {
    baton_ctx ctx;
    baton_tensor *out[2];      /* token, logits */
    baton_status code;
    char message[512];
    baton_tensor *allocs[MAX_ALLOCS];
    int n_allocs;
} fake;

static baton_tensor *f_alloc(baton_ctx *c, baton_item *it, baton_dtype dt, uint32_t nd,
                             const int64_t *dims)
{
    (void)it;
    fake *f = (fake *)c;
    baton_tensor *t = calloc(1, sizeof(*t));
    if (!t || f->n_allocs == MAX_ALLOCS) {
        free(t);
        return NULL;
    }
    t->dtype = dt;
    t->ndim = nd;
    uint64_t n = baton_dtype_size(dt);
    for (uint32_t i = 0; i < nd; i++)
        n *= (uint64_t)(t->dims[i] = dims[i]);
    t->nbytes = n;
    if (!(t->data = calloc(1, n ? n : 1))) {
        free(t);
        return NULL;
    }
    f->allocs[f->n_allocs++] = t;
    return t;
}

static int f_set_output(baton_ctx *c, baton_item *it, uint32_t o, const baton_tensor *t)
{
    if (o >= it->n_outputs || o >= 2)
        return -1;
    ((fake *)c)->out[o] = (baton_tensor *)t;
    return 0;
}

static void f_finish(baton_ctx *c, baton_item *it)
{
    (void)c, (void)it;  /* no end token can come (option eos), and the cache is large */
}

static void f_fail(baton_ctx *c, baton_item *it, baton_status code, const char *msg)
{
    (void)it;
    fake *f = (fake *)c;
    f->code = code;
    snprintf(f->message, sizeof(f->message), "%s", msg);
}

static baton_status f_cancelled(baton_ctx *c, const baton_item *it)
{
    (void)c, (void)it;
    return BATON_STATUS_OK;
}

static void fake_reset(fake *f)
{
    for (int i = 0; i < f->n_allocs; i++) {
        free(f->allocs[i]->data);
        free(f->allocs[i]);
    }
    memset(f, 0, sizeof(*f));
    f->ctx.alloc = f_alloc;
    f->ctx.set_output = f_set_output;
    f->ctx.finish = f_finish;
    f->ctx.fail = f_fail;
    f->ctx.cancelled = f_cancelled;
    f->ctx.read = fake_ctx_read;
    f->ctx.write = fake_ctx_write;
    f->ctx.device = "cpu";
}

static int read_prompt(FILE *fp, int32_t *ids)
{
    static char line[MAX_PROMPT * 8];
    if (!fgets(line, sizeof(line), fp))
        return -1;
    int n = 0;
    for (char *p = strtok(line, " \n"); p && n < MAX_PROMPT; p = strtok(NULL, " \n"))
        ids[n++] = (int32_t)strtol(p, NULL, 10);
    return n;
}

/* Runs one item of MODE on the N ids at IDS; writes its token and the gap
 * between the best and second-best logit.  0, or -1 with a message. */
static int step(const baton_backend *b, baton_model *m, baton_session *s, fake *f,
                const char *mode, int32_t *ids, int n, int32_t *tok, float *gap, float *top)
{
    static const baton_output outs[2] = {{"token", 0, 1}, {"logits", 0, 0}};
    baton_input in = {"prompt", {BATON_DTYPE_I32, 1, {n}, ids, (uint64_t)n * 4, 0}, 0, 0};
    baton_item item = {.request_id = "llamacpp-check", .node_name = mode, .mode = mode,
                       .inputs = &in, .n_inputs = 1, .outputs = outs, .n_outputs = 2,
                       .session = s};
    baton_item *items[1] = {&item};
    fake_reset(f);
    b->execute(m, &f->ctx, items, 1);
    if (f->code != BATON_STATUS_OK || !f->out[0] || !f->out[1]) {
        fprintf(stderr, "baton_greedy: %s failed (%d): %s\n", mode, (int)f->code, f->message);
        return -1;
    }
    *tok = *(const int32_t *)f->out[0]->data;
    const float *lg = f->out[1]->data;
    int64_t nv = f->out[1]->dims[0];
    float best = -1e30f, second = -1e30f;
    for (int64_t i = 0; i < nv; i++) {
        if (lg[i] > best) {
            second = best;
            best = lg[i];
        } else if (lg[i] > second) {
            second = lg[i];
        }
    }
    *gap = best - second;
    *top = best;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL.gguf f32|q8 STEPS < prompts.txt > greedy.txt\n",
                argv[0]);
        return 2;
    }
    int steps = atoi(argv[3]);
    const baton_backend *b = bk_transformer_backend();
    const char *keys[] = {"path", "max_seq", "eos", "activations", "kv_dtype"};
    const char *vals[] = {argv[1], "1024", "49151", argv[2], "f32"};
    baton_load_params p = {"llm", keys, vals, 5, 0, 1, "cpu", 1, 2, NULL, 1, 1, NULL, 0};
    baton_model *m = NULL;
    char err[512] = "";
    if (b->model_load(&p, &m, err, sizeof(err)) != BATON_STATUS_OK) {
        fprintf(stderr, "baton_greedy: model_load: %s\n", err);
        return 1;
    }
    static int32_t prompt[MAX_PROMPT];
    fake f = {0};
    int n, rc = 0;
    while (!rc && (n = read_prompt(stdin, prompt)) >= 0) {
        baton_session *s = NULL;
        if (n == 0 || n + steps > MAX_PROMPT ||
            b->session_open(m, 1, &s, err, sizeof(err)) != BATON_STATUS_OK) {
            fprintf(stderr, "baton_greedy: a prompt of %d tokens: %s\n", n, err);
            rc = 1;
            break;
        }
        int32_t tok;
        float gap, top;
        for (int i = 0; i < steps && !rc; i++) {
            rc = step(b, m, s, &f, i ? "decode" : "prefill", i ? &tok : prompt, i ? 1 : n, &tok,
                      &gap, &top);
            if (!rc)
                printf(i ? " %d:%.4f:%.4f" : "%d:%.4f:%.4f", (int)tok, (double)gap, (double)top);
        }
        putchar('\n');
        fflush(stdout);
        fake_reset(&f);
        b->session_close(m, s);
    }
    fake_reset(&f);
    b->model_unload(m);
    return rc;
}
