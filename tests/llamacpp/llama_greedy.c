/* Greedy decoding with llama.cpp, the reference side of
 * tests/llamacpp/greedy_check.py:
 *
 *   llama_greedy MODEL.gguf STEPS < prompts.txt > greedy.txt
 *
 * Each input line is a prompt as token ids separated by spaces.  For each,
 * the prompt is decoded as one batch into an empty cache, then STEPS
 * tokens are chosen by argmax of the logits, each fed back as the next
 * one-token batch.  Each output line gives, per step, the token, the gap
 * between the best and the second-best logit, and the best logit
 * ("ID:GAP:LOGIT"): the check uses the gap to tell a divergence caused by
 * rounding (a near tie) from a real one, and the logit to measure how far
 * apart the two implementations' logits are.
 *
 * The context keeps its KV cache in f32 and runs attention without flash
 * attention, so that on an F32 model every product is an f32 one, as in
 * baton's `activations: f32` path (llama.cpp's defaults store the cache in
 * f16).  On a Q4_1 model llama.cpp quantizes the activations to 8 bits
 * for its integer dot products (Q8_1), which is what baton's
 * `activations: q8` does too.
 *
 * Built by tests/llamacpp/run.sh against the llama.cpp of
 * scripts/build-llamacpp.sh; never part of `make` or `make test`. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

#define MAX_PROMPT 1024

static void quiet_log(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR || getenv("LLAMA_TOK_LOG"))
        fputs(text, stderr);
}

/* Reads one line of ids into IDS (at most MAX_PROMPT); returns the count,
 * or -1 at the end of the input. */
static int read_prompt(FILE *fp, llama_token *ids)
{
    static char line[MAX_PROMPT * 8];
    if (!fgets(line, sizeof(line), fp))
        return -1;
    int n = 0;
    for (char *p = strtok(line, " \n"); p && n < MAX_PROMPT; p = strtok(NULL, " \n"))
        ids[n++] = (llama_token)strtol(p, NULL, 10);
    return n;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL.gguf STEPS < prompts.txt > greedy.txt\n", argv[0]);
        return 2;
    }
    int steps = atoi(argv[2]);
    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "llama_greedy: cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = MAX_PROMPT;
    cp.n_batch = MAX_PROMPT;
    cp.n_ubatch = MAX_PROMPT;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llama_greedy: cannot create a context\n");
        return 1;
    }
    static llama_token prompt[MAX_PROMPT];
    int n, rc = 0;
    while (!rc && (n = read_prompt(stdin, prompt)) >= 0) {
        if (n == 0 || n + steps > MAX_PROMPT) {
            fprintf(stderr, "llama_greedy: a prompt of %d tokens\n", n);
            rc = 1;
            break;
        }
        llama_memory_clear(llama_get_memory(ctx), true);
        struct llama_batch batch = llama_batch_get_one(prompt, n);
        llama_token next = 0;
        for (int step = 0; step < steps; step++) {
            if (llama_decode(ctx, batch) != 0) {
                fprintf(stderr, "llama_greedy: llama_decode failed at step %d\n", step);
                rc = 1;
                break;
            }
            const float *lg = llama_get_logits_ith(ctx, -1);
            int best = 0, second = 1;
            if (lg[1] > lg[0])
                best = 1, second = 0;
            for (int i = 2; i < n_vocab; i++) {
                if (lg[i] > lg[best]) {
                    second = best;
                    best = i;
                } else if (lg[i] > lg[second]) {
                    second = i;
                }
            }
            printf(step ? " %d:%.4f:%.4f" : "%d:%.4f:%.4f", best, (double)(lg[best] - lg[second]),
                   (double)lg[best]);
            next = best;
            batch = llama_batch_get_one(&next, 1);
        }
        putchar('\n');
        fflush(stdout);
    }
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return rc;
}
