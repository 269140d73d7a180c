/* The built-in transformer backend (backends/transformer/backend.c) through the
 * backend ABI, on the real SmolLM2-135M-Instruct GGUF, against outputs of an
 * independent numpy forward pass (scripts/gen-smollm2-reference.py, stored
 * in tests/unit/data/smollm2_reference.txt):
 *   - a prefill's logits (the top 10, ids 0..99, full-vocab statistics) and
 *     24 greedy tokens through prefill then decode;
 *   - three requests decoding in one batch, after prefills run in chunks of
 *     8 tokens, each equal to the reference;
 *   - more requests than cache slots: evicted caches come back intact;
 *   - EOS raises the finish signal; sampling is reproducible per seed;
 *   - bad options, files and inputs fail with messages that say why.
 * Skips, saying so, when the model file is absent (scripts/fetch-model.sh). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/unit/failalloc.h"
#include "tests/unit/skip.h"

#include "backends/catalog.h"
#include "backends/transformer/transformer.h"
#ifdef BATON_CUDA
#include "kernels/kernels.h"
#endif
#include "tests/unit/fake_ctx.h"
#include "worker/plugin.h"

#define MODEL "models/smollm2-135m-instruct-q4_1.gguf"
#define FIXTURE "tests/unit/data/smollm2_reference.txt"
#define MAXP 3
#define MAXI 16

/* ---- the reference fixture ----------------------------------------------------- */

typedef struct ref_prompt {
    int32_t ids[64];
    int n;
    int32_t greedy[32];
    int ngreedy;
    int32_t top_id[10];
    float top_logit[10];
    float max, min, mean;
    float first100[100];
    bool has_first100;
} ref_prompt;

static ref_prompt REF[MAXP];

static int read_ints(char *rest, int32_t *out, int cap)
{
    int n = 0;
    for (char *tok = strtok(rest, " \n"); tok && n < cap; tok = strtok(NULL, " \n"))
        out[n++] = (int32_t)strtol(tok, NULL, 10);
    return n;
}

static void load_fixture(void)
{
    FILE *f = fopen(FIXTURE, "r");
    assert_non_null(f);
    char line[8192];
    while (fgets(line, sizeof(line), f)) {
        char kind[32];
        int p, cnt, off;
        if (line[0] == '#' || sscanf(line, "%31s %d %d%n", kind, &p, &cnt, &off) < 3)
            continue;
        if (p < 1 || p > MAXP)
            continue;
        ref_prompt *r = &REF[p - 1];
        char *rest = line + off;
        if (!strcmp(kind, "prompt")) {
            r->n = read_ints(rest, r->ids, 64);
            assert_int_equal(r->n, cnt);
        } else if (!strcmp(kind, "greedy")) {
            r->ngreedy = read_ints(rest, r->greedy, 32);
            assert_int_equal(r->ngreedy, cnt);
        } else if (!strcmp(kind, "top")) {
            int k = 0;
            for (char *tok = strtok(rest, " \n"); tok && k < 10; tok = strtok(NULL, " \n"), k++)
                assert_int_equal(sscanf(tok, "%d:%f", &r->top_id[k], &r->top_logit[k]), 2);
            assert_int_equal(k, 10);
        } else if (!strcmp(kind, "stats")) {
            /* "stats N max min mean l2": CNT swallowed the integer part of
             * max, so read the line again. */
            float l2;
            assert_int_equal(sscanf(line, "stats %d %f %f %f %f", &p, &r->max, &r->min, &r->mean,
                                    &l2), 5);
        } else if (!strcmp(kind, "logits0_99")) {
            int k = 0;
            for (char *tok = strtok(rest, " \n"); tok && k < 100; tok = strtok(NULL, " \n"))
                r->first100[k++] = strtof(tok, NULL);
            assert_int_equal(k, 100);
            r->has_first100 = true;
        }
    }
    fclose(f);
    for (int p = 0; p < MAXP; p++)
        assert_true(REF[p].n > 0 && REF[p].ngreedy == 24);
}

/* ---- a fake ctx holding what each item produced ---------------------------------- */

typedef struct item_out {
    baton_tensor *out[4];
    uint32_t cached;                /* count_cached's sum */
    int finished;
    baton_status code;
    char message[512];
} item_out;

typedef struct fake {
    baton_ctx ctx;
    baton_item *items[MAXI];
    item_out res[MAXI];
    baton_tensor *allocs[64];
    size_t n_allocs;
} fake;

static item_out *res_of(fake *f, const baton_item *it)
{
    for (int i = 0; i < MAXI; i++)
        if (f->items[i] == it)
            return &f->res[i];
    fail_msg("item not in the fake");
    return NULL;
}

static baton_tensor *f_alloc(baton_ctx *c, baton_item *it, baton_dtype dt, uint32_t nd,
                             const int64_t *dims)
{
    (void)it;
    fake *f = (fake *)c;
    assert_true(f->n_allocs < 64);
    /* Out of memory, it answers NULL as the worker's ctx does when its
     * pool is full (test_out_of_memory_ends_item makes that happen). */
    baton_tensor *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
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
    if (o >= it->n_outputs || o >= 4)
        return -1;
    res_of((fake *)c, it)->out[o] = (baton_tensor *)t;
    return 0;
}

static void f_finish(baton_ctx *c, baton_item *it)
{
    res_of((fake *)c, it)->finished = 1;
}

static void f_fail(baton_ctx *c, baton_item *it, baton_status code, const char *msg)
{
    item_out *r = res_of((fake *)c, it);
    r->code = code;
    snprintf(r->message, sizeof(r->message), "%s", msg);
}

static baton_status f_cancelled(baton_ctx *c, const baton_item *it)
{
    (void)c, (void)it;
    return BATON_STATUS_OK;
}

static void f_count_cached(baton_ctx *c, baton_item *it, uint32_t cached)
{
    res_of((fake *)c, it)->cached += cached;
}

static void fake_reset(fake *f)
{
    for (size_t i = 0; i < f->n_allocs; i++) {
        free(f->allocs[i]->data);
        free(f->allocs[i]);
    }
    memset(f, 0, sizeof(*f));
    f->ctx.alloc = f_alloc;
    f->ctx.set_output = f_set_output;
    f->ctx.finish = f_finish;
    f->ctx.fail = f_fail;
    f->ctx.cancelled = f_cancelled;
    f->ctx.count_cached = f_count_cached;
    f->ctx.read = fake_ctx_read;
    f->ctx.write = fake_ctx_write;
    f->ctx.device = "cpu";
}

/* ---- helpers ------------------------------------------------------------------- */

static const baton_backend *B;

static int setup(void **state)
{
    (void)state;
    B = bk_transformer_backend();
    assert_non_null(B);
    load_fixture();
    return 0;
}

static bool have_model(void)
{
    if (access(MODEL, R_OK) == 0)
        return true;
    skip_without_model(MODEL); /* does not return */
    return false;
}

/* Loads the model with option pairs KV (NULL-terminated), or fails the
 * test with the backend's message. */
static baton_model *load_on(const char *device, uint32_t max_batch, const char *const *kv)
{
    const char *keys[16], *vals[16];
    size_t n = 0;
    keys[n] = "path", vals[n++] = MODEL;
    bool act = false, cache = false;
    for (; kv && kv[0]; kv += 2) {
        act |= strcmp(kv[0], "activations") == 0;
        cache |= strcmp(kv[0], "kv_dtype") == 0;
        keys[n] = kv[0], vals[n++] = kv[1];
    }
    /* The reference is an f32 forward pass: compare with f32 activations
     * and an f32 cache unless a test asks otherwise (the defaults, 8-bit
     * activations and an f16 cache, are checked on their own). */
    if (!act)
        keys[n] = "activations", vals[n++] = "f32";
    if (!cache)
        keys[n] = "kv_dtype", vals[n++] = "f32";
    baton_load_params p = {"llm", keys, vals, n, 0, 1, device, max_batch, 1, NULL, 1, 1};
    baton_model *m = NULL;
    char err[512] = "";
    baton_status st = B->model_load(&p, &m, err, sizeof(err));
    if (st != BATON_STATUS_OK)
        fail_msg("model_load: %s", err);
    return m;
}

/* TF_TEST_DEVICE=cuda:0 runs these tests on a GPU (the emulated build
 * does, in tests/cudaemu/run.sh). */
static const char *test_device(void)
{
    const char *dev = getenv("TF_TEST_DEVICE");
    return dev && *dev ? dev : "cpu";
}

static baton_model *load(uint32_t max_batch, const char *const *kv)
{
    return load_on(test_device(), max_batch, kv);
}

/* Runs model_load expecting failure; returns its message in ERR. */
static baton_status load_fails(const char *const *kv, char *err, size_t errlen)
{
    const char *keys[16], *vals[16];
    size_t n = 0;
    for (; kv && kv[0]; kv += 2)
        keys[n] = kv[0], vals[n++] = kv[1];
    baton_load_params p = {"llm", keys, vals, n, 0, 1, "cpu", 2, 1, NULL, 1, 1};
    baton_model *m = NULL;
    baton_status st = B->model_load(&p, &m, err, errlen);
    assert_null(m);
    assert_int_not_equal(st, BATON_STATUS_OK);
    return st;
}

typedef struct req {
    baton_session *s;
    baton_input in;
    int32_t ids[64];
    baton_item item;
    baton_output outs[2];
} req;

static const baton_output OUT_TOKEN_LOGITS[2] = {{"token", 0, 1}, {"logits", 0, 0}};

static void req_open(baton_model *m, req *r)
{
    memset(r, 0, sizeof(*r));
    char err[128];
    assert_int_equal(B->session_open(m, 1, &r->s, err, sizeof(err)), BATON_STATUS_OK);
    memcpy(r->outs, OUT_TOKEN_LOGITS, sizeof(r->outs));
}

/* Points R's item at N ids in MODE. */
static void req_item(req *r, const char *mode, const int32_t *ids, int n)
{
    memcpy(r->ids, ids, (size_t)n * sizeof(int32_t));
    r->in = (baton_input){"prompt", {BATON_DTYPE_I32, 1, {n}, r->ids, (uint64_t)n * 4, 0}, 0, 0};
    r->item = (baton_item){.request_id = "t", .node_name = mode, .mode = mode, .inputs = &r->in,
                           .n_inputs = 1, .outputs = r->outs, .n_outputs = 2,
                           .session = r->s};
}

/* Runs the items of REQS[0..N) in one execute() and checks each
 * succeeded; returns each one's token in TOK. */
static void run(baton_model *m, fake *f, req **reqs, int n, int32_t *tok)
{
    fake_reset(f);
    baton_item *items[MAXI];
    for (int i = 0; i < n; i++)
        items[i] = f->items[i] = &reqs[i]->item;
    B->execute(m, &f->ctx, items, (size_t)n);
    for (int i = 0; i < n; i++) {
        if (f->res[i].code != BATON_STATUS_OK)
            fail_msg("item %d failed (%d): %s", i, f->res[i].code, f->res[i].message);
        assert_non_null(f->res[i].out[0]);
        tok[i] = *(const int32_t *)f->res[i].out[0]->data;
    }
}

/* ---- tests --------------------------------------------------------------------- */

/* Logits of a prefill equal the reference's within float32 noise. */
static void check_logits(const ref_prompt *r, const float *lg)
{
    for (int k = 0; k < 10; k++)
        if (fabsf(lg[r->top_id[k]] - r->top_logit[k]) > 0.02f)
            fail_msg("logit of token %d: %f, reference %f", r->top_id[k],
                     (double)lg[r->top_id[k]], (double)r->top_logit[k]);
    double mean = 0;
    float mx = -1e30f, mn = 1e30f;
    for (int i = 0; i < 49152; i++) {
        mean += lg[i];
        mx = lg[i] > mx ? lg[i] : mx;
        mn = lg[i] < mn ? lg[i] : mn;
    }
    mean /= 49152;
    assert_true(fabsf(mx - r->max) < 0.02f && fabsf(mn - r->min) < 0.02f);
    assert_true(fabs(mean - r->mean) < 0.01);
    for (int i = 0; r->has_first100 && i < 100; i++)
        if (fabsf(lg[i] - r->first100[i]) > 0.02f)
            fail_msg("logit of token %d: %f, reference %f", i, (double)lg[i],
                     (double)r->first100[i]);
}

static const char *const NO_EOS[] = {"eos", "49151", "max_seq", "96", NULL};

static void test_prefill_and_greedy_match_reference(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    baton_model *m = load(4, NO_EOS);
    fake f = {0};
    fake_reset(&f);
    req r, *rp = &r;
    req_open(m, &r);
    const ref_prompt *ref = &REF[0];
    int32_t tok;
    req_item(&r, "prefill", ref->ids, ref->n);
    run(m, &f, &rp, 1, &tok);
    assert_int_equal(f.res[0].out[1]->dims[0], 49152);
    check_logits(ref, f.res[0].out[1]->data);
    assert_int_equal(tok, ref->greedy[0]);
    for (int step = 1; step < ref->ngreedy; step++) {
        int32_t in = tok;
        req_item(&r, "decode", &in, 1);
        run(m, &f, &rp, 1, &tok);
        if (tok != ref->greedy[step])
            fail_msg("step %d: token %d, reference %d", step, tok, ref->greedy[step]);
    }
    fake_reset(&f);
    B->session_close(m, r.s);
    B->model_unload(m);
}

/* Largest top-two logit gap at which 8-bit activations may pick another
 * token than the f32 reference.  Rounding each activation to 8 bits per
 * block of 32 moves the logits of this model by up to about 0.7 (the test
 * prints the largest move it saw), but mostly all together: the gap
 * between two tokens moves by less.  Where the reference's two best tokens
 * are closer than Q8_GAP either may win, as in llama.cpp, which quantizes
 * activations the same way. */
#define Q8_GAP 0.5f

/* Greedy decoding of each reference prompt by a model loaded with the
 * options Q8 (8-bit activations or an 8-bit cache) follows the
 * reference's tokens until a step where the reference's top-two gap is
 * under Q8_GAP; the gaps are those of the f32 run, which equals the
 * reference token for token.  WHAT names the 8-bit part in messages. */
static void track_reference(const char *const *q8, const char *what)
{
    static const char *const f32[] = {"eos", "49151", "activations", "f32", "kv_dtype", "f32",
                                      NULL};
    baton_model *mf = load(1, f32), *mq = load(1, q8);
    int matched = 0, total = 0;
    float worst = 0;
    for (int p = 0; p < MAXP; p++) {
        const ref_prompt *ref = &REF[p];
        fake f = {0};
        fake_reset(&f);
        req rf, rq, *pf = &rf, *pq = &rq;
        req_open(mf, &rf);
        req_open(mq, &rq);
        int32_t tf, tq;
        req_item(&rf, "prefill", ref->ids, ref->n);
        req_item(&rq, "prefill", ref->ids, ref->n);
        bool diverged = false;
        for (int step = 0; step < ref->ngreedy && !diverged; step++) {
            run(mf, &f, &pf, 1, &tf);
            float gap = INFINITY, top = -INFINITY;
            const float *lf = f.res[0].out[1]->data;
            for (int i = 0; i < 49152; i++)
                top = lf[i] > top ? lf[i] : top;
            for (int i = 0; i < 49152; i++)
                if (i != tf && top - lf[i] < gap)
                    gap = top - lf[i];
            float ftop = lf[tf];
            assert_int_equal(tf, ref->greedy[step]);
            run(mq, &f, &pq, 1, &tq);
            const float *lq = f.res[0].out[1]->data;
            float move = fabsf(lq[tf] - ftop);
            worst = move > worst ? move : worst;
            total++;
            if (tq == tf) {
                matched++;
            } else {
                if (gap >= Q8_GAP)
                    fail_msg("prompt %d step %d: %s chose %d over %d, where the reference "
                             "leads by %.3f", p + 1, step, what, tq, tf, (double)gap);
                diverged = true; /* the contexts differ from here on */
            }
            int32_t inf = tf, inq = tq;
            req_item(&rf, "decode", &inf, 1);
            req_item(&rq, "decode", &inq, 1);
        }
        fake_reset(&f);
        B->session_close(mf, rf.s);
        B->session_close(mq, rq.s);
    }
    print_message("%s: %d of %d greedy tokens as the reference before any divergence; "
                  "largest move of the reference token's logit %.3f\n", what, matched, total,
                  (double)worst);
    assert_true(matched > 0);
    B->model_unload(mf);
    B->model_unload(mq);
}

/* The defaults: 8-bit activations and an f16 cache (two threads). */
static void test_q8_activations_track_reference(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    if (strcmp(test_device(), "cpu") != 0)
        skip_because("the GPU kernels take f32 activations only");
    static const char *const q8[] = {"eos", "49151", "activations", "q8", "kv_dtype", "f16",
                                     "threads", "2", NULL};
    track_reference(q8, "8-bit activations");
}

/* A q8_0 cache with f32 activations: the cache's rounding alone. */
static void test_q8_cache_tracks_reference(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    if (strcmp(test_device(), "cpu") != 0)
        skip_because("the GPU kernels keep an f32 cache only");
    static const char *const q8[] = {"eos", "49151", "activations", "f32", "kv_dtype", "q8_0",
                                     "threads", "2", NULL};
    track_reference(q8, "a q8_0 KV cache");
}

#define TP_STEPS 8

/* Rank RANK of a two-GPU tensor-parallel group (its FFN shard on
 * cuda:RANK, the group joined with ID): the greedy tokens of reference
 * prompt 0 into TOK.  Runs in a forked child too, so it reports by return
 * value (0, or the step that failed + 2), never through cmocka. */
static int tp_greedy(int rank, const void *id, size_t id_len, int32_t *tok)
{
    char dev[16];
    snprintf(dev, sizeof(dev), "cuda:%d", rank);
    const char *keys[] = {"path", "eos", "max_seq"}, *vals[] = {MODEL, "49151", "96"};
    baton_load_params p = {"llm", keys, vals, 3, (uint32_t)rank, 2, dev, 4, 1, NULL, 1, 1,
                           id, id_len};
    baton_model *m = NULL;
    char err[512] = "";
    if (B->model_load(&p, &m, err, sizeof(err)) != BATON_STATUS_OK) {
        fprintf(stderr, "rank %d: model_load: %s\n", rank, err);
        return 1;
    }
    fake f = {0};
    req r;
    req_open(m, &r);
    const ref_prompt *ref = &REF[0];
    int rc = 0;
    for (int step = 0; step < TP_STEPS && !rc; step++) {
        if (step == 0)
            req_item(&r, "prefill", ref->ids, ref->n);
        else
            req_item(&r, "decode", &tok[step - 1], 1);
        fake_reset(&f);
        baton_item *items[1] = {&r.item};
        f.items[0] = &r.item;
        B->execute(m, &f.ctx, items, 1);
        if (f.res[0].code != BATON_STATUS_OK || !f.res[0].out[0]) {
            fprintf(stderr, "rank %d, step %d: %s\n", rank, step, f.res[0].message);
            rc = step + 2;
        } else {
            tok[step] = *(const int32_t *)f.res[0].out[0]->data;
        }
    }
    fake_reset(&f);
    B->session_close(m, r.s);
    B->model_unload(m);
    return rc;
}

/* The FFN split over two GPUs (tp 2: each rank holds half its rows and
 * columns, and NCCL sums the down products) gives the reference's greedy
 * tokens, as one GPU does.  GPUs only: the CPU has no collective. */
static void test_tensor_parallel_matches_reference(void **state)
{
    (void)state;
    if (!have_model() || strncmp(test_device(), "cuda:", 5) != 0)
        skip_because("tensor parallelism needs GPUs (TF_TEST_DEVICE=cuda:N)");
#ifdef BATON_CUDA
    unsigned char id[K_CUDA_COMM_ID_BYTES];
    assert_int_equal(k_cuda_comm_unique_id(id, sizeof(id)), 0);
    fflush(stdout);
    fflush(stderr);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        int32_t tok[TP_STEPS];
        _exit(tp_greedy(1, id, sizeof(id), tok));
    }
    int32_t tok[TP_STEPS];
    int rc = tp_greedy(0, id, sizeof(id), tok);
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_int_equal(rc, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    for (int step = 0; step < TP_STEPS; step++)
        if (tok[step] != REF[0].greedy[step])
            fail_msg("tp 2, step %d: token %d, reference %d", step, tok[step],
                     REF[0].greedy[step]);
#else
    skip_because("a build without CUDA");
#endif
}

/* Three requests prefilled in chunks of 8 tokens, then decoding in one
 * batch each step. */
static void test_batched_decode_matches_reference(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    static const char *const kv[] = {"eos", "49151", "max_seq", "64", "prefill_chunk", "8", NULL};
    baton_model *m = load(4, kv);
    fake f = {0};
    fake_reset(&f);
    req r[MAXP], *rp[MAXP];
    int32_t tok[MAXP];
    for (int p = 0; p < MAXP; p++) {
        rp[p] = &r[p];
        req_open(m, &r[p]);
        req_item(&r[p], "prefill", REF[p].ids, REF[p].n);
        run(m, &f, &rp[p], 1, &tok[p]);
        check_logits(&REF[p], f.res[0].out[1]->data);
        assert_int_equal(tok[p], REF[p].greedy[0]);
    }
    for (int step = 1; step < 24; step++) {
        int32_t in[MAXP];
        for (int p = 0; p < MAXP; p++) {
            in[p] = tok[p];
            req_item(&r[p], "decode", &in[p], 1);
        }
        run(m, &f, rp, MAXP, tok);
        for (int p = 0; p < MAXP; p++)
            if (tok[p] != REF[p].greedy[step])
                fail_msg("prompt %d step %d: token %d, reference %d", p + 1, step, tok[p],
                         REF[p].greedy[step]);
    }
    fake_reset(&f);
    for (int p = 0; p < MAXP; p++)
        B->session_close(m, r[p].s);
    B->model_unload(m);
}

/* Two cache slots, three requests decoding in turns of two: every turn
 * evicts one and brings one back. */
#define TURN_STEPS 8

/* Prefills the three reference prompts on a model with SLOTS cache slots
 * and cache type KV_DT, then decodes them two at a time in a rotation, so
 * that with 2 slots every turn evicts the third session; the greedy tokens
 * of each prompt (after its first) go to GOT. */
static void run_turns(int slots, const char *kv_dt, int32_t got[MAXP][TURN_STEPS])
{
    const char *const kv[] = {"eos", "49151", "max_seq", "64", "kv_dtype", kv_dt, NULL};
    baton_model *m = load((uint32_t)slots, kv);
    fake f = {0};
    fake_reset(&f);
    req r[MAXP], *rp[MAXP];
    int32_t tok[MAXP];
    int step[MAXP];
    for (int p = 0; p < MAXP; p++) {
        rp[p] = &r[p];
        req_open(m, &r[p]);
        req_item(&r[p], "prefill", REF[p].ids, REF[p].n);
        run(m, &f, &rp[p], 1, &tok[p]);
        step[p] = 0;
    }
    static const int turns[][2] = {{0, 1}, {2, 0}, {1, 2}, {0, 1}, {2, 0}, {1, 2},
                                   {0, 2}, {1, 0}, {2, 1}};
    for (size_t t = 0; t < sizeof(turns) / sizeof(turns[0]); t++) {
        req *pair[2] = {&r[turns[t][0]], &r[turns[t][1]]};
        int32_t in[2], out[2];
        for (int i = 0; i < 2; i++) {
            in[i] = tok[turns[t][i]];
            req_item(pair[i], "decode", &in[i], 1);
        }
        run(m, &f, pair, 2, out);
        for (int i = 0; i < 2; i++) {
            int p = turns[t][i];
            assert_true(step[p] < TURN_STEPS);
            got[p][step[p]++] = tok[p] = out[i];
        }
    }
    fake_reset(&f);
    for (int p = 0; p < MAXP; p++) {
        assert_int_equal(step[p], 6);
        B->session_close(m, r[p].s);
    }
    B->model_unload(m);
}

/* More sessions than slots, f32 cache: every session's tokens are the
 * reference's, however often it was evicted and brought back. */
static void test_eviction_keeps_caches(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    int32_t got[MAXP][TURN_STEPS];
    run_turns(2, "f32", got);
    for (int p = 0; p < MAXP; p++)
        for (int k = 0; k < 6; k++)
            if (got[p][k] != REF[p].greedy[k + 1])
                fail_msg("prompt %d step %d: token %d, reference %d", p + 1, k + 1, got[p][k],
                         REF[p].greedy[k + 1]);
}

/* The same with f16 and q8_0 caches (which the reference does not model):
 * evicted and restored caches give exactly the tokens of a run with a slot
 * for every session, so the copies out and back are lossless. */
static void test_eviction_keeps_narrow_caches(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    if (strcmp(test_device(), "cpu") != 0)
        skip_because("the GPU kernels keep f32 caches only");
    static const char *const types[] = {"f16", "q8_0"};
    for (int t = 0; t < 2; t++) {
        int32_t evicted[MAXP][TURN_STEPS], resident[MAXP][TURN_STEPS];
        run_turns(2, types[t], evicted);
        run_turns(3, types[t], resident);
        for (int p = 0; p < MAXP; p++)
            for (int k = 0; k < 6; k++)
                if (evicted[p][k] != resident[p][k])
                    fail_msg("%s: prompt %d step %d: token %d evicted, %d resident", types[t],
                             p + 1, k + 1, evicted[p][k], resident[p][k]);
    }
}

/* A prefill's cache handed off as the `kv` tensor (f32) from a q8_0 cache
 * into another model's q8_0 cache: the blocks leave widened and come back
 * quantized to the same blocks, so the receiving decode gives the tokens
 * the prefill's own model gives when it decodes the same prompt. */
static void test_handoff_q8_cache(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    if (strcmp(test_device(), "cpu") != 0)
        skip_because("the GPU kernels keep f32 caches only");
    static const char *const q8[] = {"activations", "f32", "kv_dtype", "q8_0", NULL};
    baton_model *ma = load(1, q8), *mb = load(1, q8);
    const ref_prompt *ref = &REF[1];
    fake f = {0};
    fake_reset(&f);
    enum { STEPS = 6 };
    /* The prefill's model decodes the prompt itself. */
    req ra, *pa = &ra;
    req_open(ma, &ra);
    req_item(&ra, "prefill", ref->ids, ref->n);
    int32_t own[STEPS + 1];
    run(ma, &f, &pa, 1, &own[0]);
    for (int k = 1; k <= STEPS; k++) {
        int32_t in = own[k - 1];
        req_item(&ra, "decode", &in, 1);
        run(ma, &f, &pa, 1, &own[k]);
    }
    B->session_close(ma, ra.s);
    /* Another session of it prefills with the cache as an output... */
    req rh, *ph = &rh;
    req_open(ma, &rh);
    req_item(&rh, "prefill", ref->ids, ref->n);
    rh.outs[1] = (baton_output){"kv", 0, 0};
    int32_t first;
    run(ma, &f, &ph, 1, &first);
    assert_int_equal(first, own[0]);
    const baton_tensor *kv = f.res[0].out[1];
    assert_non_null(kv);
    assert_int_equal(kv->dims[2], ref->n);
    /* The fake's tensors go with its next reset: keep the cache's copy. */
    size_t bytes = kv->nbytes;
    int64_t dims[BATON_MAX_DIMS];
    memcpy(dims, kv->dims, sizeof(dims));
    float *copy = malloc(bytes);
    assert_non_null(copy);
    memcpy(copy, kv->data, bytes);
    /* ...and the second model decodes from it. */
    req rd, *pd = &rd;
    req_open(mb, &rd);
    int32_t tok = first;
    baton_input ins[2];
    for (int k = 1; k <= STEPS; k++) {
        int32_t in = tok;
        req_item(&rd, "decode", &in, 1);
        ins[0] = rd.in;
        ins[0].name = "token";
        ins[1] = (baton_input){"kv", {BATON_DTYPE_F32, 4, {0}, copy, bytes, 0}, 0, 0};
        memcpy(ins[1].tensor.dims, dims, sizeof(dims));
        rd.item.inputs = ins;
        rd.item.n_inputs = k == 1 ? 2 : 1;
        run(mb, &f, &pd, 1, &tok);
        if (tok != own[k])
            fail_msg("step %d: %d after the hand-off, %d without", k, tok, own[k]);
    }
    fake_reset(&f);
    free(copy);
    B->session_close(ma, rh.s);
    B->session_close(mb, rd.s);
    B->model_unload(ma);
    B->model_unload(mb);
}

/* With the GGUF's EOS (id 2), prompt 1's answer ends after "Paris.": the
 * step producing EOS raises finish, and EOS fed back finishes again
 * without running. */
static void test_eos_finishes(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    static const char *const kv[] = {"max_seq", "64", NULL};
    baton_model *m = load(1, kv);
    fake f = {0};
    fake_reset(&f);
    req r, *rp = &r;
    req_open(m, &r);
    const ref_prompt *ref = &REF[0];
    int32_t tok;
    req_item(&r, "prefill", ref->ids, ref->n);
    run(m, &f, &rp, 1, &tok);
    int step = 1;
    for (; step < ref->ngreedy; step++) {
        int32_t in = tok;
        req_item(&r, "decode", &in, 1);
        run(m, &f, &rp, 1, &tok);
        assert_int_equal(tok, ref->greedy[step]);
        if (f.res[0].finished)
            break;
    }
    assert_int_equal(tok, 2);
    assert_int_equal(ref->greedy[step], 2);
    int32_t in = tok;
    req_item(&r, "decode", &in, 1);
    run(m, &f, &rp, 1, &tok);
    assert_true(f.res[0].finished);
    assert_int_equal(tok, 2);
    fake_reset(&f);
    B->session_close(m, r.s);
    B->model_unload(m);
}

/* Sampling at temperature 0.8 with a seed: the same seed gives the same
 * tokens, another seed (almost surely) others, and every token is in the
 * vocabulary. */
#define SAMPLED 8

/* Samples SAMPLED tokens of reference prompt 1 with SEED on M. */
static void sample_seq(baton_model *m, uint64_t seed, int32_t *seq)
{
    fake f = {0};
    fake_reset(&f);
    req r, *rp = &r;
    req_open(m, &r);
    req_item(&r, "prefill", REF[1].ids, REF[1].n);
    r.item.sampling = (baton_sampling){0.8f, 40, 0.95f, seed};
    run(m, &f, &rp, 1, &seq[0]);
    for (int s = 1; s < SAMPLED; s++) {
        int32_t in = seq[s - 1];
        req_item(&r, "decode", &in, 1);
        r.item.sampling = (baton_sampling){0.8f, 40, 0.95f, seed};
        run(m, &f, &rp, 1, &seq[s]);
        assert_true(seq[s] >= 0 && seq[s] < 49152);
    }
    fake_reset(&f);
    B->session_close(m, r.s);
}

/* A seed samples alike every time and differs from another seed; on a GPU
 * (sampled there by the device's sampler) it samples what the CPU does. */
static void test_sampling_reproducible(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    baton_model *m = load(2, NO_EOS);
    int32_t seq[3][SAMPLED];
    static const uint64_t seeds[3] = {7, 7, 8};
    for (int k = 0; k < 3; k++)
        sample_seq(m, seeds[k], seq[k]);
    assert_memory_equal(seq[0], seq[1], sizeof(seq[0]));
    assert_memory_not_equal(seq[0], seq[2], sizeof(seq[0]));
    B->model_unload(m);
    if (strcmp(test_device(), "cpu") != 0) {
        int32_t cpu[SAMPLED];
        m = load_on("cpu", 2, NO_EOS);
        sample_seq(m, seeds[0], cpu);
        B->model_unload(m);
        assert_memory_equal(seq[0], cpu, sizeof(cpu));
    }
}

/* Decode steps with host sampling (a top_k of 100 sorts its candidates)
 * while each allocation of the step fails in turn: an item that met a
 * failure ends RESOURCE_EXHAUSTED, never INTERNAL and never by a crash, and
 * the model serves the next step.  CPU only: on a GPU the step's memory is
 * the device's. */
static void test_out_of_memory_ends_item(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    if (strcmp(test_device(), "cpu") != 0)
        skip_because("allocation failures are injected on the CPU only");
    /* Without the prefix cache: its bookkeeping (the session's token ids)
     * gives up caching on a failed allocation instead of failing the step,
     * which test_prefix_cache_no_memory checks. */
    static const char *const opts[] = {"eos", "49151", "max_seq", "96", "prefix_cache", "false",
                                       NULL};
    baton_model *m = load(1, opts);
    fake f = {0};
    fake_reset(&f);
    req r, *rp = &r;
    req_open(m, &r);
    req_item(&r, "prefill", REF[1].ids, REF[1].n);
    int32_t tok;
    run(m, &f, &rp, 1, &tok);
    long n = 0;
    for (bool failed = true; failed;) {
        int32_t in = tok;
        req_item(&r, "decode", &in, 1);
        r.item.sampling = (baton_sampling){0.8f, 100, 0.95f, 3};
        fake_reset(&f);
        baton_item *items[1] = {&r.item};
        f.items[0] = &r.item;
        fa_fail_nth(++n);
        B->execute(m, &f.ctx, items, 1);
        failed = fa_failed();
        fa_off();
        if (failed) {
            if (f.res[0].code != BATON_STATUS_RESOURCE_EXHAUSTED)
                fail_msg("allocation %ld of a decode step failed: code %d '%s', want "
                         "RESOURCE_EXHAUSTED", n, f.res[0].code, f.res[0].message);
        } else {
            if (f.res[0].code != BATON_STATUS_OK)
                fail_msg("decode: code %d '%s'", f.res[0].code, f.res[0].message);
            tok = *(const int32_t *)f.res[0].out[0]->data;
        }
    }
    assert_true(n > 2);
    fake_reset(&f);
    B->session_close(m, r.s);
    B->model_unload(m);
}

/* With the prefix cache, each allocation of a prefill, a decode step and a
 * session's end fails in turn: the item fails RESOURCE_EXHAUSTED or runs
 * (the cache's own bookkeeping gives up caching instead), the end keeps
 * the prefix or not, and the model serves the same prompt after each. */
static void test_prefix_cache_no_memory(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    if (strcmp(test_device(), "cpu") != 0)
        skip_because("allocation failures are injected on the CPU only");
    baton_model *m = load(1, NO_EOS);
    fake f = {0};
    for (long n = 1, done = 0; !done; n++) {
        req r, *rp = &r;
        req_open(m, &r);
        req_item(&r, "prefill", REF[0].ids, REF[0].n);
        fake_reset(&f);
        baton_item *items[1] = {&r.item};
        f.items[0] = &r.item;
        fa_fail_nth(n);
        B->execute(m, &f.ctx, items, 1);
        bool hit = fa_failed();
        int32_t tok = f.res[0].code == BATON_STATUS_OK ? *(const int32_t *)f.res[0].out[0]->data
                                                        : -1;
        if (f.res[0].code != BATON_STATUS_OK && f.res[0].code != BATON_STATUS_RESOURCE_EXHAUSTED)
            fail_msg("prefill with allocation %ld failing: code %d '%s'", n, f.res[0].code,
                     f.res[0].message);
        for (int step = 0; tok >= 0 && step < 2; step++) {
            int32_t in = tok;
            req_item(&r, "decode", &in, 1);
            fake_reset(&f);
            f.items[0] = &r.item;
            B->execute(m, &f.ctx, items, 1);
            hit |= fa_failed();
            tok = f.res[0].code == BATON_STATUS_OK ? *(const int32_t *)f.res[0].out[0]->data : -1;
            if (f.res[0].code != BATON_STATUS_OK &&
                f.res[0].code != BATON_STATUS_RESOURCE_EXHAUSTED)
                fail_msg("decode with allocation %ld failing: code %d", n, f.res[0].code);
        }
        fake_reset(&f);
        B->session_close(m, r.s);
        hit |= fa_failed();
        fa_off();
        done = !hit;
        /* The same prompt, nothing failing: served. */
        req_open(m, &r);
        req_item(&r, "prefill", REF[0].ids, REF[0].n);
        run(m, &f, &rp, 1, &tok);
        assert_int_equal(tok, REF[0].greedy[0]);
        fake_reset(&f);
        B->session_close(m, r.s);
    }
    B->model_unload(m);
}

/* Runs one item expected to fail with CODE and a message containing WANT. */
static void expect_item_fails(baton_model *m, req *r, baton_status code, const char *want)
{
    fake f = {0};
    fake_reset(&f);
    baton_item *items[1] = {&r->item};
    f.items[0] = &r->item;
    B->execute(m, &f.ctx, items, 1);
    if (f.res[0].code != code || !strstr(f.res[0].message, want))
        fail_msg("got code %d '%s'; want code %d with '%s'", f.res[0].code, f.res[0].message,
                 code, want);
    fake_reset(&f);
}

static void test_bad_inputs(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    static const char *const kv[] = {"max_seq", "16", NULL};
    baton_model *m = load(2, kv);
    req r;
    req_open(m, &r);
    int32_t one = 5, bad = 49152, many[20] = {0};
    req_item(&r, "decode", &one, 1);
    expect_item_fails(m, &r, BATON_STATUS_FAILED_PRECONDITION, "before any prefill");
    req_item(&r, "prefill", &bad, 1);
    expect_item_fails(m, &r, BATON_STATUS_INVALID_ARGUMENT, "outside the vocabulary");
    req_item(&r, "prefill", many, 20);
    expect_item_fails(m, &r, BATON_STATUS_INVALID_ARGUMENT, "does not fit max_seq 16");
    req_item(&r, "prefill", &one, 0);
    expect_item_fails(m, &r, BATON_STATUS_INVALID_ARGUMENT, "no tokens");
    req_item(&r, "prefill", &one, 1);
    r.in.tensor.dtype = BATON_DTYPE_F32;
    expect_item_fails(m, &r, BATON_STATUS_INVALID_ARGUMENT, "want UTF-8 text (U8) or token ids");
    req_item(&r, "sideways", &one, 1);
    expect_item_fails(m, &r, BATON_STATUS_INVALID_ARGUMENT, "mode 'sideways'");
    req_item(&r, "prefill", &one, 1);
    r.outs[1].name = "probabilities";
    expect_item_fails(m, &r, BATON_STATUS_INVALID_ARGUMENT, "unknown output 'probabilities'");
    /* The session still works after all of that; the cache fills at 16. */
    r.outs[1].name = "logits";
    fake f = {0};
    req *rp = &r;
    int32_t tok;
    req_item(&r, "prefill", many, 15);
    run(m, &f, &rp, 1, &tok);
    int32_t in = tok;
    req_item(&r, "decode", &in, 1);
    run(m, &f, &rp, 1, &tok);
    assert_true(f.res[0].finished);  /* the cache is full: 16 positions */
    in = tok;
    req_item(&r, "decode", &in, 1);
    expect_item_fails(m, &r, BATON_STATUS_RESOURCE_EXHAUSTED, "KV cache is full");
    fake_reset(&f);
    B->session_close(m, r.s);
    B->model_unload(m);
}

/* A text prompt goes through the file's tokenizer and chat template: the
 * question becomes prompt 1's ids (the same first token), and the answer
 * comes back as text, EOS adding none. */
static void test_text_prompt(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    baton_model *m = load(1, NULL);
    req r, *rp = &r;
    req_open(m, &r);
    static const char q[] = "What is the capital of France?";
    r.outs[1].name = "text";
    req_item(&r, "prefill", REF[0].ids, 1);
    r.in.tensor = (baton_tensor){BATON_DTYPE_U8, 1, {sizeof(q) - 1}, (void *)q, sizeof(q) - 1, 0};
    fake f = {0};
    int32_t tok;
    run(m, &f, &rp, 1, &tok);
    char answer[256] = "";
    size_t len = 0;
    for (int step = 0; step < 16; step++) {
        const baton_tensor *t = f.res[0].out[1];
        assert_int_equal(t->dtype, BATON_DTYPE_U8);
        memcpy(answer + len, t->data, t->nbytes);
        len += t->nbytes;
        if (f.res[0].finished)
            break;
        int32_t in = tok;
        req_item(&r, "decode", &in, 1);
        r.outs[1].name = "text";
        run(m, &f, &rp, 1, &tok);
    }
    assert_string_equal(answer, "The capital of France is Paris.");
    assert_true(f.res[0].finished);
    fake_reset(&f);
    B->session_close(m, r.s);
    B->model_unload(m);
}

/* Appends one turn to a conversation in the backend ABI's encoding
 * (baton_chat_next); returns the new length. */
static size_t put_turn(uint8_t *at, size_t len, const char *role, const char *content)
{
    const char *s[2] = {role, content};
    for (int k = 0; k < 2; k++) {
        uint32_t n = (uint32_t)strlen(s[k]);
        for (int i = 0; i < 4; i++)
            at[len++] = (uint8_t)(n >> (8 * i));
        memcpy(at + len, s[k], n);
        len += n;
    }
    return len;
}

/* The prefill's first token and logits for R's item.  LOGITS: 49152 floats. */
static int32_t prefill_logits(baton_model *m, req *r, float *logits)
{
    fake f = {0};
    int32_t tok;
    req *rp = r;
    run(m, &f, &rp, 1, &tok);
    memcpy(logits, f.res[0].out[1]->data, 49152 * sizeof(float));
    fake_reset(&f);
    return tok;
}

/* A prefill with two inputs reads a conversation, then the text of one
 * more user turn (a voice chat: the turns the client sent, then what was
 * heard): the same prompt as the whole conversation given at once, and
 * with no turns before it, as the text alone in the chat template. */
static void test_turn_after_conversation(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    baton_model *m = load(1, NULL);
    static const char q[] = "What is the capital of France?";
    uint8_t conv[256], whole[256];
    size_t nc = put_turn(conv, 0, "system", "You are a pirate. Answer briefly.");
    nc = put_turn(conv, nc, "user", "Hello!");
    nc = put_turn(conv, nc, "assistant", "Ahoy, matey!");
    memcpy(whole, conv, nc);
    size_t nw = put_turn(whole, nc, "user", q);
    float *a = malloc(49152 * sizeof(float)), *b = malloc(49152 * sizeof(float));
    assert_non_null(a);
    assert_non_null(b);
    req r;
    req_open(m, &r);
    baton_input two[2] = {
        {"context", {BATON_DTYPE_U8, 1, {(int64_t)nc}, conv, nc, 0}, 0, 0, 1, 0},
        {"text", {BATON_DTYPE_U8, 1, {sizeof(q) - 1}, (void *)q, sizeof(q) - 1, 0}, 0, 0, 0, 0}};
    req_item(&r, "prefill", REF[0].ids, 1);
    r.item.inputs = two, r.item.n_inputs = 2;
    int32_t ta = prefill_logits(m, &r, a);
    req_item(&r, "prefill", REF[0].ids, 1);
    r.in = (baton_input){"prompt", {BATON_DTYPE_U8, 1, {(int64_t)nw}, whole, nw, 0}, 0, 0, 1, 0};
    int32_t tb = prefill_logits(m, &r, b);
    assert_int_equal(ta, tb);
    assert_memory_equal(a, b, 49152 * sizeof(float));
    /* No turns before: the text alone, in the template. */
    two[0].tensor = (baton_tensor){BATON_DTYPE_U8, 1, {0}, conv, 0, 0};
    two[0].chat = 0;
    req_item(&r, "prefill", REF[0].ids, 1);
    r.item.inputs = two, r.item.n_inputs = 2;
    ta = prefill_logits(m, &r, a);
    req_item(&r, "prefill", REF[0].ids, 1);
    r.in.tensor = (baton_tensor){BATON_DTYPE_U8, 1, {sizeof(q) - 1}, (void *)q, sizeof(q) - 1, 0};
    tb = prefill_logits(m, &r, b);
    assert_int_equal(ta, tb);
    assert_memory_equal(a, b, 49152 * sizeof(float));
    /* Text where the conversation goes, and a conversation where the text
     * goes, are refused. */
    two[0].tensor = two[1].tensor;
    req_item(&r, "prefill", REF[0].ids, 1);
    r.item.inputs = two, r.item.n_inputs = 2;
    expect_item_fails(m, &r, BATON_STATUS_INVALID_ARGUMENT,
                      "input 'context': want the request's messages (or nothing)");
    two[0].tensor = (baton_tensor){BATON_DTYPE_U8, 1, {(int64_t)nc}, conv, nc, 0};
    two[0].chat = 1;
    two[1] = two[0];
    two[1].name = "text";
    expect_item_fails(m, &r, BATON_STATUS_INVALID_ARGUMENT, "input 'text': want UTF-8 text");
    free(a);
    free(b);
    B->session_close(m, r.s);
    B->model_unload(m);
}

/* ---- prefix caching ------------------------------------------------------------- */

#define PC_STEPS 8 /* decode steps after each prefill */

/* A prefix-cache scenario run the same way on a model with the cache and
 * one without: every token of every turn, and per turn the prompt tokens
 * read from the cache. */
typedef struct pc_run {
    int32_t tok[8][PC_STEPS + 1];
    uint32_t cached[8];
    int turns;
} pc_run;

/* Prefills the prompts P[0..N) (lengths LEN) in one execute(), decodes
 * PC_STEPS greedy tokens of all of them together, and closes their
 * sessions; each turn's tokens and cached count go to the next turns of
 * OUT. */
static void pc_turns(baton_model *m, const int32_t *const *p, const int *len, int n, pc_run *out)
{
    fake f = {0};
    req r[2], *rp[2];
    int32_t tok[2];
    assert_true(n <= 2);
    for (int i = 0; i < n; i++) {
        rp[i] = &r[i];
        req_open(m, &r[i]);
        req_item(&r[i], "prefill", p[i], len[i]);
    }
    run(m, &f, rp, n, tok);
    int t0 = out->turns;
    for (int i = 0; i < n; i++) {
        out->cached[t0 + i] = f.res[i].cached;
        out->tok[t0 + i][0] = tok[i];
    }
    for (int step = 1; step <= PC_STEPS; step++) {
        int32_t in[2];
        for (int i = 0; i < n; i++) {
            in[i] = tok[i];
            req_item(&r[i], "decode", &in[i], 1);
        }
        run(m, &f, rp, n, tok);
        for (int i = 0; i < n; i++)
            out->tok[t0 + i][step] = tok[i];
    }
    fake_reset(&f);
    for (int i = 0; i < n; i++)
        B->session_close(m, r[i].s);
    out->turns += n;
}

/* Writes the N ids A then the M ids B to OUT; returns N + M. */
static int cat_ids(int32_t *out, const int32_t *a, int n, const int32_t *b, int m)
{
    /* A may be OUT itself (a prompt grown in place), B may be NULL (M 0). */
    memmove(out, a, (size_t)n * sizeof(*a));
    if (m)
        memcpy(out + n, b, (size_t)m * sizeof(*b));
    return n + m;
}

/* A conversation and its neighbours, on model M: turn 1 the 37-token chat
 * prompt; turn 2 that prompt, turn 1's answer as the model wrote it (its
 * 8 fed tokens) and 5 more: the 45 cached positions end in the middle of a
 * block, and the session takes the slot over; turn 3 a prompt sharing
 * only its first 20 tokens (copied out of the entry, which stays); turns 4
 * and 5 two prompts prefilled and decoded together, both sharing 30 tokens
 * with the cache. */
static void pc_conversation(baton_model *m, pc_run *out)
{
    const ref_prompt *a = &REF[0], *b = &REF[1];
    int32_t p[2][64];
    const int32_t *pp[2] = {p[0], p[1]};
    int len[2];
    memset(out, 0, sizeof(*out));
    len[0] = cat_ids(p[0], a->ids, a->n, NULL, 0);
    pc_turns(m, pp, len, 1, out);
    len[0] = cat_ids(p[0], a->ids, a->n, out->tok[0], PC_STEPS);
    len[0] = cat_ids(p[0], p[0], len[0], b->ids, b->n);
    pc_turns(m, pp, len, 1, out);
    len[0] = cat_ids(p[0], a->ids, 20, b->ids, b->n);
    pc_turns(m, pp, len, 1, out);
    len[0] = cat_ids(p[0], a->ids, 30, b->ids, b->n);
    len[1] = cat_ids(p[1], a->ids, 30, b->ids + 2, b->n - 2);
    pc_turns(m, pp, len, 2, out);
}

static void pc_expect_same(const pc_run *with, const pc_run *without, const char *what)
{
    assert_int_equal(with->turns, without->turns);
    for (int t = 0; t < with->turns; t++)
        for (int k = 0; k <= PC_STEPS; k++)
            if (with->tok[t][k] != without->tok[t][k])
                fail_msg("%s: turn %d token %d: %d with the prefix cache, %d without", what,
                         t + 1, k, with->tok[t][k], without->tok[t][k]);
}

/* The batch_invariant option, where a run's exactness must not depend on
 * how its prompt was cut into pieces (on the CPU and on a GPU). */
static const char *invariant_opt(void)
{
    return "batch_invariant";
}

/* Greedy tokens with the prefix cache equal those without it, in f32 and
 * 8-bit activations (the CPU's two modes, batch invariant: a prefix read
 * from the cache and one computed are then the same bits; on a GPU its one
 * mode), and the prompt tokens read from the cache are those the scenario
 * shares. */
static void test_prefix_cache_exact(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    bool cpu = strcmp(test_device(), "cpu") == 0;
    for (int mode = 0; mode < (cpu ? 2 : 1); mode++) {
        const char *act = mode ? "q8" : "f32", *kv = mode ? "f16" : "f32";
        const char *const on[] = {"eos", "49151", "max_seq", "96", "activations", act,
                                  "kv_dtype", kv, invariant_opt(), "true", NULL};
        const char *const off[] = {"eos", "49151", "max_seq", "96", "activations", act,
                                   "kv_dtype", kv, "prefix_cache", "false", invariant_opt(),
                                   "true", NULL};
        pc_run with, without;
        baton_model *m = load(2, on);
        pc_conversation(m, &with);
        baton_cache_report rep = {0};
        assert_int_equal(B->cache_report(m, &rep), 1);
        B->model_unload(m);
        m = load(2, off);
        pc_conversation(m, &without);
        assert_int_equal(B->cache_report(m, &rep), 0);
        B->model_unload(m);
        pc_expect_same(&with, &without, act);
        const uint32_t want[5] = {0, 45, 20, 30, 30};
        for (int t = 0; t < 5; t++) {
            assert_int_equal(without.cached[t], 0);
            if (with.cached[t] != want[t])
                fail_msg("%s: turn %d read %u cached tokens, want %u", act, t + 1,
                         with.cached[t], want[t]);
        }
    }
}

/* One slot: a second conversation takes it, so the first's cached prefix
 * is evicted: with no host budget it is dropped and the first's next turn
 * computes everything; with one, it moves to host memory and comes back.
 * Either way the tokens are those of a model without the cache. */
static void test_prefix_cache_eviction(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    const ref_prompt *a = &REF[0], *b = &REF[1];
    static const char *const budgets[] = {"0", "16"};
    pc_run base = {0};
    for (int k = 0; k < 3; k++) {
        const char *const opts[] = {"eos", "49151", "max_seq", "96", "prefix_cache",
                                    k < 2 ? "true" : "false", "prefix_cache_mb",
                                    k < 2 ? budgets[k] : "0", invariant_opt(), "true", NULL};
        baton_model *m = load(1, opts);
        pc_run r = {0};
        int32_t p[2][64], rev[64];
        const int32_t *pp[2] = {p[0], p[1]};
        int len[2];
        for (int i = 0; i < a->n; i++)
            rev[i] = a->ids[a->n - 1 - i];
        len[0] = cat_ids(p[0], a->ids, a->n, NULL, 0);
        pc_turns(m, pp, len, 1, &r);
        len[0] = cat_ids(p[0], rev, a->n, NULL, 0);
        pc_turns(m, pp, len, 1, &r);
        len[0] = cat_ids(p[0], a->ids, a->n, r.tok[0], PC_STEPS);
        len[0] = cat_ids(p[0], p[0], len[0], b->ids, b->n);
        pc_turns(m, pp, len, 1, &r);
        baton_cache_report rep = {0};
        if (k < 2) {
            assert_int_equal(B->cache_report(m, &rep), 1);
            assert_int_equal(rep.evictions, k == 0 ? 2 : 0); /* 0 MiB: both were dropped */
            assert_int_equal(r.cached[2], k == 0 ? 0 : 45);
            /* With room in host memory every turn's KV stays: two moved
             * there, the last one in the slot. */
            assert_int_equal(rep.entries, k == 0 ? 1 : 3);
        }
        B->model_unload(m);
        if (k == 2)
            pc_expect_same(&base, &r, "after an eviction");
        else if (k == 0)
            base = r;
        else
            pc_expect_same(&base, &r, "after a move to host memory");
    }
}

/* One slot (max_batch 1): a prompt that shares only part of the cached
 * prefix in that slot reads that part in place (no other slot to copy it
 * to) and answers as a model without the cache does. */
static void test_prefix_cache_one_slot(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    const ref_prompt *a = &REF[0], *b = &REF[1];
    pc_run r[2];
    memset(r, 0, sizeof(r));
    for (int k = 0; k < 2; k++) {
        const char *const opts[] = {"eos", "49151", "max_seq", "96", "prefix_cache",
                                    k ? "false" : "true", invariant_opt(), "true", NULL};
        baton_model *m = load(1, opts);
        int32_t p[2][64];
        const int32_t *pp[2] = {p[0], p[1]};
        int len[2];
        len[0] = cat_ids(p[0], a->ids, a->n, NULL, 0);
        pc_turns(m, pp, len, 1, &r[k]);
        len[0] = cat_ids(p[0], a->ids, 20, b->ids, b->n);
        pc_turns(m, pp, len, 1, &r[k]);
        B->model_unload(m);
    }
    assert_int_equal(r[0].cached[1], 20);
    pc_expect_same(&r[0], &r[1], "one slot");
}

/* batch_invariant: the logits of a prompt's last token are the same bits
 * whether the prompt ran as one prefill, as a prefill and decode steps fed
 * its remaining tokens, or so beside another request in every decode batch,
 * in each activation mode of the device (the CPU's f32 and 8-bit; a GPU's
 * f32). */
static void test_batch_invariant(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    const ref_prompt *a = &REF[0];
    enum { V = 49152 };
    float *want = malloc(V * sizeof(float)), *got = malloc(V * sizeof(float));
    assert_non_null(want);
    assert_non_null(got);
    for (int mode = 0; mode < (strcmp(test_device(), "cpu") == 0 ? 2 : 1); mode++) {
        const char *const opts[] = {"eos", "49151", "max_seq", "96", "activations",
                                    mode ? "q8" : "f32", "kv_dtype", mode ? "q8_0" : "f32",
                                    "batch_invariant", "true", "prefix_cache", "false", NULL};
        baton_model *m = load(2, opts);
        fake f = {0};
        req r[2], *rp[2] = {&r[0], &r[1]};
        int32_t tok[2];
        req_open(m, &r[0]);
        req_item(&r[0], "prefill", a->ids, a->n);
        run(m, &f, rp, 1, tok);
        memcpy(want, f.res[0].out[1]->data, V * sizeof(float));
        fake_reset(&f);
        B->session_close(m, r[0].s);
        for (int beside = 0; beside < 2; beside++) {
            /* The first 30 tokens, then one decode step per remaining one;
             * BESIDE: another request decodes in the same batches. */
            req_open(m, &r[0]);
            req_item(&r[0], "prefill", a->ids, 30);
            run(m, &f, rp, 1, tok);
            if (beside) {
                req_open(m, &r[1]);
                req_item(&r[1], "prefill", REF[1].ids, REF[1].n);
                run(m, &f, &rp[1], 1, &tok[1]);
            }
            for (int p = 30; p < a->n; p++) {
                int32_t in[2] = {a->ids[p], tok[1]};
                req_item(&r[0], "decode", &in[0], 1);
                if (beside)
                    req_item(&r[1], "decode", &in[1], 1);
                run(m, &f, rp, 1 + beside, tok);
            }
            memcpy(got, f.res[0].out[1]->data, V * sizeof(float));
            fake_reset(&f);
            B->session_close(m, r[0].s);
            if (beside)
                B->session_close(m, r[1].s);
            for (int i = 0; i < V; i++)
                if (got[i] != want[i])
                    fail_msg("%s activations%s: logit %d is %.9g after decode steps, %.9g "
                             "after one prefill", mode ? "8-bit" : "f32",
                             beside ? ", beside another request" : "", i, got[i], want[i]);
        }
        B->model_unload(m);
    }
    free(want);
    free(got);
}

/* Fails unless GOT, the logits of token S beside other requests, are the
 * bits WANT it had alone. */
static void same_logits(const float *got, const float *want, const char *act, int s)
{
    for (int i = 0; i < 49152; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            fail_msg("%s activations: token %d's logit %d is %.9g beside fifteen requests, "
                     "%.9g alone", act, s, i, (double)got[i], (double)want[i]);
}

/* The same ids under any load (batch_invariant): a prompt's greedy tokens
 * alone equal its tokens beside fifteen requests with prompts of other
 * lengths, which join over the first steps and leave after other numbers
 * of tokens, so that the batch's size and the prompt's row in it change
 * from step to step and its slot is not the first; in each activation mode
 * of the device.  The logits behind each token are the same bits too:
 * twelve greedy tokens of these prompts come out the same without the
 * option as well (no near tie among them), but not their logits. */
static void test_same_ids_under_load(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    enum { N = 16, A = 6, V = 49152 };
    /* Fewer steps on a GPU: the emulator takes minutes for each. */
    const int STEPS = strcmp(test_device(), "cpu") == 0 ? 12 : 6;
    const ref_prompt *a = &REF[0];
    float *want = malloc((size_t)13 * V * sizeof(float));
    assert_non_null(want);
    for (int mode = 0; mode < (strcmp(test_device(), "cpu") == 0 ? 2 : 1); mode++) {
        const char *act = mode ? "q8" : "f32";
        const char *const opts[] = {"eos", "49151", "max_seq", "96", "activations", act,
                                    "batch_invariant", "true", "prefix_cache", "false", NULL};
        baton_model *m = load(N, opts);
        fake f = {0};
        static req r[N];
        req *rp[N];
        int32_t alone[13], loaded[13], last[N], tok[N];
        /* Alone. */
        rp[0] = &r[0];
        req_open(m, &r[0]);
        req_item(&r[0], "prefill", a->ids, a->n);
        run(m, &f, rp, 1, &alone[0]);
        memcpy(want, f.res[0].out[1]->data, V * sizeof(float));
        for (int s = 1; s <= STEPS; s++) {
            req_item(&r[0], "decode", &alone[s - 1], 1);
            run(m, &f, rp, 1, &alone[s]);
            memcpy(want + (size_t)s * V, f.res[0].out[1]->data, V * sizeof(float));
        }
        B->session_close(m, r[0].s);
        fake_reset(&f);
        /* Beside fifteen others: request I opens I-th (A's slot is not the
         * first), joins at step I % 3 (A at step 1), and the others leave
         * after 2 + 5I % 13 tokens. */
        int produced[N] = {0}, quota[N];
        bool active[N] = {false};
        for (int i = 0; i < N; i++) {
            req_open(m, &r[i]);
            quota[i] = i == A ? STEPS + 1 : 2 + (5 * i) % 13;
        }
        for (int s = 0; produced[A] <= STEPS; s++) {
            assert_true(s < 64);
            for (int i = 0; i < N; i++) {
                if ((i == A ? 1 : i % 3) != s)
                    continue;
                const ref_prompt *p = &REF[1 + i % 2];
                int n = 4 + 3 * (i % 8) < p->n ? 4 + 3 * (i % 8) : p->n;
                req *one = &r[i];
                req_item(one, "prefill", i == A ? a->ids : p->ids, i == A ? a->n : n);
                run(m, &f, &one, 1, &last[i]);
                active[i] = true;
                if (i == A) {
                    loaded[0] = last[i];
                    same_logits(f.res[0].out[1]->data, want, act, 0);
                }
                produced[i] = 1;
            }
            /* The step's rows in an order that turns with S. */
            int n = 0, order[N];
            for (int k = 0; k < N; k++) {
                int i = s % 2 ? (k + s) % N : N - 1 - (k + 3 * s) % N;
                if (active[i] && produced[i] < quota[i]) {
                    req_item(&r[i], "decode", &last[i], 1);
                    order[n] = i;
                    rp[n++] = &r[i];
                }
            }
            if (!n)
                continue;
            run(m, &f, rp, n, tok);
            for (int k = 0; k < n; k++) {
                int i = order[k];
                last[i] = tok[k];
                if (i == A) {
                    loaded[produced[i]] = tok[k];
                    same_logits(f.res[k].out[1]->data, want + (size_t)produced[i] * V, act,
                                produced[i]);
                }
                if (++produced[i] == quota[i] && i != A) {
                    B->session_close(m, r[i].s);
                    active[i] = false;
                }
            }
        }
        for (int i = 0; i < N; i++)
            if (active[i] || i == A)
                B->session_close(m, r[i].s);
        fake_reset(&f);
        B->model_unload(m);
        for (int s = 0; s <= STEPS; s++)
            if (loaded[s] != alone[s])
                fail_msg("%s activations: token %d is %d beside fifteen requests, %d alone", act,
                         s, loaded[s], alone[s]);
    }
    free(want);
}

static void test_bad_loads(void **state)
{
    (void)state;
    char err[512];
    static const char *const none[] = {NULL};
    load_fails(none, err, sizeof(err));
    assert_non_null(strstr(err, "option path is required"));
    static const char *const missing[] = {"path", "/nonexistent/m.gguf", NULL};
    load_fails(missing, err, sizeof(err));
    assert_non_null(strstr(err, "/nonexistent/m.gguf"));
    /* A folder is read as a Hugging Face model: one without config.json
     * is refused naming the file it lacks. */
    static const char *const folder[] = {"path", "tests/unit", NULL};
    load_fails(folder, err, sizeof(err));
    if (!strstr(err, "tests/unit: config.json: no such file"))
        fail_msg("a folder without config.json: '%s'", err);
    static const char *const seq[] = {"path", MODEL, "max_seq", "lots", NULL};
    load_fails(seq, err, sizeof(err));
    assert_non_null(strstr(err, "max_seq = 'lots'"));
    static const char *const kv8[] = {"path", MODEL, "kv_dtype", "q8", NULL};
    load_fails(kv8, err, sizeof(err));
    assert_non_null(strstr(err, "kv_dtype = 'q8': use auto, f16, q8_0 or f32"));
    static const char *const act[] = {"path", MODEL, "activations", "i4", NULL};
    load_fails(act, err, sizeof(err));
    assert_non_null(strstr(err, "activations = 'i4'"));
    /* A file that is not GGUF. */
    char path[] = "/tmp/baton-tf-XXXXXX.gguf";
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "not a model at all, just text", 29), 29);
    close(fd);
    const char *const junk[] = {"path", path, NULL};
    load_fails(junk, err, sizeof(err));
    if (!strstr(err, "magic") || !strstr(err, path))
        fail_msg("a text file: '%s'", err);
    unlink(path);
}

/* The options come from backends/catalog.c: a load that names none but
 * the path gets the declared defaults (the report shows them), and a value
 * the catalog does not allow is refused with the catalog's own words, the
 * ones `batond --check-config` prints. */
static void test_options_from_catalog(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    const bt_backend_desc *b = bt_backend_find("transformer");
    assert_non_null(b);
    static const struct {
        const char *key, *value;
    } bad[] = {
        {"kv_dtype", "q4"},  {"activations", "f16"}, {"max_seq", "1"},
        {"prefill_chunk", "0"}, {"eos", "-2"},     {"threads", "1025"},
        {"chat_template", "yes"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *const kv[] = {"path", MODEL, bad[i].key, bad[i].value, NULL};
        char err[512] = "", want[512] = "";
        assert_int_equal(load_fails(kv, err, sizeof(err)), BATON_STATUS_INVALID_ARGUMENT);
        bt_opt_value v;
        assert_int_not_equal(bt_opt_parse(b, bt_backend_option(b, bad[i].key), bad[i].value, &v,
                                          want, sizeof(want)), 0);
        assert_string_equal(err, want);
    }

    /* Only the path: every other option takes its declared default. */
    bt_opt_value seq, chunk, kv, act, chat;
    assert_int_equal(bt_opt_parse(b, bt_backend_option(b, "max_seq"), NULL, &seq, NULL, 0), 0);
    assert_int_equal(bt_opt_parse(b, bt_backend_option(b, "prefill_chunk"), NULL, &chunk, NULL,
                                  0), 0);
    assert_int_equal(bt_opt_parse(b, bt_backend_option(b, "kv_dtype"), NULL, &kv, NULL, 0), 0);
    assert_int_equal(bt_opt_parse(b, bt_backend_option(b, "activations"), NULL, &act, NULL, 0),
                     0);
    assert_int_equal(bt_opt_parse(b, bt_backend_option(b, "chat_template"), NULL, &chat, NULL,
                                  0), 0);
    assert_string_equal(kv.s, "auto");
    assert_string_equal(act.s, "q8");
    const char *keys[] = {"path"}, *vals[] = {MODEL};
    baton_load_params p = {"llm", keys, vals, 1, 0, 1, "cpu", 1, 1, NULL, 1, 1};
    baton_model *m = NULL;
    char err[512] = "";
    if (B->model_load(&p, &m, err, sizeof(err)) != BATON_STATUS_OK)
        fail_msg("model_load with defaults: %s", err);
    int need = B->model_describe(m, NULL, 0);
    char *text = malloc((size_t)need + 1);
    assert_non_null(text);
    B->model_describe(m, text, (size_t)need + 1);
    char want[128];
    /* auto on a CPU is f16; q8 is the 8-bit activations. */
    snprintf(want, sizeof(want), "KV cache f16, 1 slots x %lld positions", (long long)seq.i);
    if (!strstr(text, want))
        fail_msg("'%s' not in the report:\n%s", want, text);
    assert_non_null(strstr(text, "activations 8-bit"));
    snprintf(want, sizeof(want), "prefill (bucket of %lld tokens)", (long long)chunk.i);
    assert_non_null(strstr(text, want));
    assert_non_null(strstr(text, chat.b ? "chat template on" : "chat template off"));
    free(text);
    B->model_unload(m);
}

/* The load report carries each executable's schedule line and arena. */
static void test_describe(void **state)
{
    (void)state;
    if (!have_model())
        skip();
    baton_model *m = load(4, NO_EOS);
    assert_non_null(B->model_describe);
    int need = B->model_describe(m, NULL, 0);
    assert_true(need > 100);
    char *text = malloc((size_t)need + 1);
    assert_int_equal(B->model_describe(m, text, (size_t)need + 1), need);
    assert_non_null(strstr(text, "prefill (bucket of 96 tokens)"));
    assert_non_null(strstr(text, "decode (batch 4)"));
    bool gpu = strncmp(test_device(), "cuda:", 5) == 0;
    /* The CPU profile keeps this model serial; the GPU's may split it. */
    assert_non_null(strstr(text, gpu ? "decision: " : "decision: serial"));
    assert_non_null(strstr(text, "arena:"));
    assert_true(!gpu == !strstr(text, "replayed as a CUDA graph"));
    assert_non_null(strstr(text, "30 layers, hidden 576, 9/3 heads"));
    /* Weights are counted once: read in place from the mapping on the CPU
     * (about 95 MiB), uploaded once on a GPU, where the Q8_0 embedding is
     * widened to f32 (about 178 MiB). */
    uint64_t wb = B->model_bytes(m);
    if (gpu)
        assert_true(wb > 150u << 20 && wb < 200u << 20);
    else
        assert_true(wb > 80u << 20 && wb < 100u << 20);
    free(text);
    B->model_unload(m);
}

int main(void)
{
    /* TF_TEST_FILTER runs the tests whose names match (the emulated GPU
     * runs a few: it is slow). */
    const char *filter = getenv("TF_TEST_FILTER");
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_and_greedy_match_reference),
        cmocka_unit_test(test_q8_activations_track_reference),
        cmocka_unit_test(test_q8_cache_tracks_reference),
        cmocka_unit_test(test_batched_decode_matches_reference),
        cmocka_unit_test(test_eviction_keeps_caches),
        cmocka_unit_test(test_eviction_keeps_narrow_caches),
        cmocka_unit_test(test_handoff_q8_cache),
        cmocka_unit_test(test_eos_finishes),
        cmocka_unit_test(test_out_of_memory_ends_item),
        cmocka_unit_test(test_sampling_reproducible),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_text_prompt),
        cmocka_unit_test(test_turn_after_conversation),
        cmocka_unit_test(test_prefix_cache_exact),
        cmocka_unit_test(test_prefix_cache_eviction),
        cmocka_unit_test(test_prefix_cache_no_memory),
        cmocka_unit_test(test_prefix_cache_one_slot),
        cmocka_unit_test(test_batch_invariant),
        cmocka_unit_test(test_same_ids_under_load),
        cmocka_unit_test(test_bad_loads),
        cmocka_unit_test(test_describe),
        cmocka_unit_test(test_options_from_catalog),
        cmocka_unit_test(test_tensor_parallel_matches_reference),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
