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
static int step(const baton_backend *b, baton_model *m, baton_session *s, fake_one *f,
                const char *mode, int32_t *ids, int n, int32_t *tok, float *gap, float *top)
{
    static const baton_output outs[2] = {{"token", 0, 1}, {"logits", 0, 0}};
    baton_input in = {"prompt", {BATON_DTYPE_I32, 1, {n}, ids, (uint64_t)n * 4, 0}, 0, 0};
    baton_item item = {.request_id = "llamacpp-check", .node_name = mode, .mode = mode,
                       .inputs = &in, .n_inputs = 1, .outputs = outs, .n_outputs = 2,
                       .session = s};
    baton_item *items[1] = {&item};
    fake_one_reset(f);
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
    fake_one f = {0};
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
        fake_one_reset(&f);
        b->session_close(m, s);
    }
    fake_one_reset(&f);
    b->model_unload(m);
    return rc;
}
