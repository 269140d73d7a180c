/* The baton_ctx of the lanes (ctx.h). */
#include "worker/ctx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "worker/join.h"

static const wk_ctx_env *ctx_env(const baton_ctx *ctx)
{
    return ctx->impl;
}

/* The slot behind a tensor the backend hands back, or NULL. */
static wk_slot *slot_of(wk_item *it, const baton_tensor *t)
{
    if (!t || t->handle == 0 || t->handle > it->n_slots)
        return NULL;
    wk_slot *s = it->slots[t->handle - 1];
    return &s->t == t || s->t.data == t->data ? s : NULL;
}

static baton_tensor *ctx_alloc(baton_ctx *ctx, baton_item *item, baton_dtype dtype,
                               uint32_t ndim, const int64_t *dims)
{
    const wk_ctx_env *env = ctx_env(ctx);
    wk_item *it = (wk_item *)item;
    char msg[256];
    if (ndim > BATON_MAX_DIMS || wk_tensor_bytes(dtype, ndim, dims) == UINT64_MAX) {
        snprintf(msg, sizeof(msg), "node '%s': backend asked for an invalid tensor shape",
                 item->node_name);
        wk_item_fail(it, BATON_STATUS_INTERNAL, msg);
        return NULL;
    }
    wk_slot *s = wk_item_slot_add(it);
    if (!s) {
        wk_item_fail(it, BATON_STATUS_RESOURCE_EXHAUSTED, "out of host memory");
        return NULL;
    }
    pthread_mutex_lock(env->lock);
    wk_tensor *t = wk_store_tensor_new(env->store, it->req, dtype, ndim, dims, true);
    wk_pool_stats st;
    if (!t)
        wk_store_pool_stats(env->store, &st);
    pthread_mutex_unlock(env->lock);
    if (!t) {
        snprintf(msg, sizeof(msg), "node '%s': the pool of worker %s is full (%llu bytes asked, "
                 "largest free block %llu)", item->node_name, env->worker,
                 (unsigned long long)wk_tensor_bytes(dtype, ndim, dims),
                 (unsigned long long)st.largest_free);
        wk_item_fail(it, BATON_STATUS_RESOURCE_EXHAUSTED, msg);
        it->n_slots--;
        free(s);
        return NULL;
    }
    s->own = t;
    s->ref = t->ref;
    s->created = true;
    s->writable = true;
    wk_item_slot_view(s, wk_store_tensor_data(env->store, t));
    return &s->t;
}

/* Checks a read or write of N bytes at OFFSET of TENSOR; the slot, or
 * NULL after failing the item. */
static wk_slot *copy_slot(baton_item *item, const baton_tensor *tensor, uint64_t offset,
                          uint64_t n, bool write)
{
    wk_item *it = (wk_item *)item;
    wk_slot *s = slot_of(it, tensor);
    char msg[256];
    if (!s || offset > s->t.nbytes || n > s->t.nbytes - offset || (write && !s->writable)) {
        snprintf(msg, sizeof(msg), "node '%s': backend %s %llu bytes at offset %llu of %s",
                 item->node_name, write ? "wrote" : "read", (unsigned long long)n,
                 (unsigned long long)offset,
                 !s ? "a tensor the worker does not know"
                 : write && !s->writable ? "a tensor it may not write (an input)"
                                         : "a tensor too small for that");
        wk_item_fail(it, BATON_STATUS_INTERNAL, msg);
        return NULL;
    }
    return s;
}

static int ctx_copy(baton_ctx *ctx, baton_item *item, void *dst, const void *src, uint64_t n)
{
    char err[256], msg[384];
    if (wk_device_copy(ctx_env(ctx)->dev, ctx->stream, dst, src, n, err, sizeof(err)) == 0)
        return 0;
    snprintf(msg, sizeof(msg), "node '%s': %s", item->node_name, err);
    wk_item_fail((wk_item *)item, BATON_STATUS_INTERNAL, msg);
    return -1;
}

static int ctx_read(baton_ctx *ctx, baton_item *item, const baton_tensor *tensor,
                    uint64_t offset, void *dst, uint64_t n)
{
    wk_slot *s = copy_slot(item, tensor, offset, n, false);
    return s ? ctx_copy(ctx, item, dst, (const uint8_t *)s->t.data + offset, n) : -1;
}

static int ctx_write(baton_ctx *ctx, baton_item *item, baton_tensor *tensor, uint64_t offset,
                     const void *src, uint64_t n)
{
    wk_slot *s = copy_slot(item, tensor, offset, n, true);
    return s ? ctx_copy(ctx, item, (uint8_t *)s->t.data + offset, src, n) : -1;
}

static int ctx_emit_chunk(baton_ctx *ctx, baton_item *item, uint32_t output,
                          const baton_tensor *tensor, int final)
{
    const wk_ctx_env *env = ctx_env(ctx);
    wk_item *it = (wk_item *)item;
    if (output >= item->n_outputs || !item->outputs[output].stream || it->stream_closed[output])
        return -1;
    wk_slot *s = NULL;
    if (tensor && !(s = slot_of(it, tensor)))
        return -1;
    if (!tensor && !final)
        return -1;
    /* A chunk is reported at once, so what the backend queued on the
     * lane's stream must be written first. */
    char err[256], msg[384];
    if (wk_device_sync(env->dev, ctx->stream, err, sizeof(err)) != 0) {
        snprintf(msg, sizeof(msg), "node '%s': %s", item->node_name, err);
        wk_item_fail(it, BATON_STATUS_INTERNAL, msg);
        return -1;
    }
    wk_chunk c = {.output = output, .index = it->chunk_next[output], .final = final != 0};
    if (s) {
        c.has_ref = true;
        c.ref = s->ref;
        c.created = s->created;
        c.host = wk_ctx_inline_copy(env, ctx->stream, s->t.data, wk_ctx_slot_on_device(env, s),
                                    s->t.nbytes, item->outputs[output].client);
    }
    if (env->chunk(env->arg, it, &c) != 0) {
        free(c.host);
        return -1;
    }
    it->chunk_next[output]++;
    if (s)
        s->chunked = true;
    if (final)
        it->stream_closed[output] = true;
    return 0;
}

static int ctx_set_output(baton_ctx *ctx, baton_item *item, uint32_t output,
                          const baton_tensor *tensor)
{
    wk_item *it = (wk_item *)item;
    if (output >= item->n_outputs)
        return -1;
    if (item->outputs[output].stream)
        return ctx_emit_chunk(ctx, item, output, tensor, 1);
    wk_slot *s = slot_of(it, tensor);
    if (!s)
        return -1;
    free(it->results[output].host);
    it->results[output] = (wk_result){.set = true, .created = s->created, .ref = s->ref,
                                      .data = s->t.data,
                                      .device = wk_ctx_slot_on_device(ctx_env(ctx), s)};
    return 0;
}

static int ctx_forward(baton_ctx *ctx, baton_item *item, uint32_t output, uint32_t input)
{
    if (input >= item->n_inputs)
        return -1;
    return ctx_set_output(ctx, item, output, &item->inputs[input].tensor);
}

static void ctx_finish(baton_ctx *ctx, baton_item *item)
{
    (void)ctx;
    ((wk_item *)item)->finish = true;
}

/* The executor queues the item again after execute (executor.c). */
static void ctx_defer(baton_ctx *ctx, baton_item *item)
{
    (void)ctx;
    ((wk_item *)item)->defer = true;
}

static uint32_t add_sat(uint32_t a, uint32_t b)
{
    return a > UINT32_MAX - b ? UINT32_MAX : a + b;
}

static void ctx_count_tokens(baton_ctx *ctx, baton_item *item, uint32_t prompt,
                             uint32_t generated)
{
    (void)ctx;
    wk_item *it = (wk_item *)item;
    it->prompt_tokens = add_sat(it->prompt_tokens, prompt);
    it->generated_tokens = add_sat(it->generated_tokens, generated);
}

static void ctx_count_cached(baton_ctx *ctx, baton_item *item, uint32_t cached)
{
    (void)ctx;
    wk_item *it = (wk_item *)item;
    it->cached_tokens = add_sat(it->cached_tokens, cached);
}

static void ctx_fail(baton_ctx *ctx, baton_item *item, baton_status code, const char *message)
{
    (void)ctx;
    wk_item_fail((wk_item *)item, code, message);
}

static baton_status item_cancelled(const wk_ctx_env *env, const wk_item *it, uint64_t now)
{
    if (atomic_load(&it->cancelled) || atomic_load(env->stopping))
        return BATON_STATUS_CANCELLED;
    if (it->deadline_ns && now >= it->deadline_ns)
        return BATON_STATUS_DEADLINE_EXCEEDED;
    return BATON_STATUS_OK;
}

static baton_status ctx_cancelled(baton_ctx *ctx, const baton_item *item)
{
    return item_cancelled(ctx_env(ctx), (const wk_item *)item, bt_now_ns());
}

static baton_status ctx_sleep_ms(baton_ctx *ctx, const baton_item *item, uint32_t ms)
{
    const wk_ctx_env *env = ctx_env(ctx);
    const wk_item *it = (const wk_item *)item;
    uint64_t end = bt_now_ns() + (uint64_t)ms * 1000000u;
    if (it->deadline_ns && it->deadline_ns < end)
        end = it->deadline_ns;
    struct timespec ts = {(time_t)(end / 1000000000u), (long)(end % 1000000000u)};
    baton_status st;
    pthread_mutex_lock(env->lock);
    /* A cancel broadcasts `wake` under the lock (wk_executor_cancel), so
     * it cannot slip in between the check and the wait. */
    while ((st = item_cancelled(env, it, bt_now_ns())) == BATON_STATUS_OK && bt_now_ns() < end)
        pthread_cond_timedwait(env->wake, env->lock, &ts);
    pthread_mutex_unlock(env->lock);
    return st;
}

bool wk_ctx_slot_on_device(const wk_ctx_env *env, const wk_slot *s)
{
    if (s->map)
        return s->map->cuda_device >= 0;
    return wk_device_space(env->dev) == WK_SPACE_CUDA;
}

void *wk_ctx_inline_copy(const wk_ctx_env *env, void *stream, const void *data, bool device,
                         uint64_t n, bool client)
{
    if (!client || !device || n == 0 || n > WK_INLINE_MAX)
        return NULL;
    void *host = malloc(n);
    char err[256];
    if (host && wk_device_copy(env->dev, stream, host, data, n, err, sizeof(err)) != 0) {
        bt_warn("a client output of %llu bytes stays on the device: %s", (unsigned long long)n,
                err);
        free(host);
        host = NULL;
    }
    return host;
}

void wk_ctx_init(baton_ctx *ctx, const wk_ctx_env *env, void *stream)
{
    *ctx = (baton_ctx){.alloc = ctx_alloc,
                       .set_output = ctx_set_output,
                       .forward = ctx_forward,
                       .emit_chunk = ctx_emit_chunk,
                       .finish = ctx_finish,
                       .fail = ctx_fail,
                       .cancelled = ctx_cancelled,
                       .sleep_ms = ctx_sleep_ms,
                       .read = ctx_read,
                       .write = ctx_write,
                       .count_tokens = ctx_count_tokens,
                       .defer = ctx_defer,
                       .count_cached = ctx_count_cached,
                       .threads = env->threads,
                       .device = env->device,
                       .stream = stream,
                       .impl = (void *)env};
}
