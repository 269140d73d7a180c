/* The client connections (daemon/clients.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/clients.h"

static uint64_t hash_identity(const uint8_t *id, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ id[i]) * 0x100000001b3ULL;
    return h == 0 || h == UINT64_MAX ? 1 : h;
}

void cl_init(cl_table *t)
{
    memset(t, 0, sizeof(*t));
    u64map_init(&t->by_hash);
}

static void wait_link(cl_table *t, cl_client *c)
{
    c->wait_prev = NULL;
    c->wait_next = t->waiting;
    if (t->waiting)
        t->waiting->wait_prev = c;
    t->waiting = c;
}

static void wait_unlink(cl_table *t, cl_client *c)
{
    if (c->wait_prev)
        c->wait_prev->wait_next = c->wait_next;
    else if (t->waiting == c)
        t->waiting = c->wait_next;
    if (c->wait_next)
        c->wait_next->wait_prev = c->wait_prev;
    c->wait_prev = c->wait_next = NULL;
}

static void drop_backlog(cl_table *t, cl_client *c)
{
    if (c->head)
        wait_unlink(t, c);
    for (cl_frame *f = c->head, *next; f; f = next) {
        next = f->next;
        free(f);
    }
    t->backlog_bytes -= c->backlog_bytes;
    c->head = c->tail = NULL;
    c->n_backlog = 0;
    c->backlog_bytes = 0;
    c->stalled_since_ms = 0;
}

cl_client *cl_find(const cl_table *t, const uint8_t *id, size_t len)
{
    for (cl_client *c = u64map_get(&t->by_hash, hash_identity(id, len)); c; c = c->next)
        if (c->identity_len == len && memcmp(c->identity, id, len) == 0)
            return c;
    return NULL;
}

cl_client *cl_get(cl_table *t, const uint8_t *id, size_t len)
{
    cl_client *c = cl_find(t, id, len);
    if (c)
        return c;
    c = calloc(1, sizeof(*c));
    if (!c || !(c->identity = malloc(len ? len : 1)))
        goto err;
    memcpy(c->identity, id, len);
    c->identity_len = len;
    c->hkey = hash_identity(id, len);
    c->next = u64map_get(&t->by_hash, c->hkey);
    if (u64map_put(&t->by_hash, c->hkey, c) < 0)
        goto err;
    t->n++;
    return c;
err:
    if (c)
        free(c->identity);
    free(c);
    return NULL;
}

void cl_remove(cl_table *t, cl_client *c)
{
    cl_client *head = u64map_get(&t->by_hash, c->hkey);
    if (head == c) {
        if (c->next)
            u64map_put(&t->by_hash, c->hkey, c->next);
        else
            u64map_del(&t->by_hash, c->hkey);
    } else {
        for (cl_client *p = head; p; p = p->next)
            if (p->next == c) {
                p->next = c->next;
                break;
            }
    }
    drop_backlog(t, c);
    t->busy -= c->inflight > 0;
    t->n--;
    free(c->identity);
    free(c);
}

void cl_release_if_idle(cl_table *t, cl_client *c, uint64_t now_ms, uint64_t keep_ms)
{
    if (c && !c->inflight && !c->n_backlog && (!c->refused_ms || c->refused_ms + keep_ms < now_ms))
        cl_remove(t, c);
}

void cl_inflight_add(cl_table *t, cl_client *c)
{
    t->busy += c->inflight == 0;
    c->inflight++;
}

void cl_inflight_sub(cl_table *t, cl_client *c)
{
    if (!c->inflight)
        return;
    c->inflight--;
    t->busy -= c->inflight == 0;
}

void cl_backlog_push(cl_table *t, cl_client *c, cl_frame *f, uint64_t now_ms)
{
    f->next = NULL;
    if (c->tail) {
        c->tail->next = f;
    } else {
        c->head = f;
        wait_link(t, c);
    }
    c->tail = f;
    c->n_backlog++;
    c->backlog_bytes += f->len;
    t->backlog_bytes += f->len;
    if (!c->stalled_since_ms)
        c->stalled_since_ms = now_ms;
}

cl_frame *cl_backlog_pop(cl_table *t, cl_client *c, uint64_t now_ms)
{
    cl_frame *f = c->head;
    if (!f)
        return NULL;
    c->head = f->next;
    if (!c->head) {
        c->tail = NULL;
        wait_unlink(t, c);
    }
    c->n_backlog--;
    c->backlog_bytes -= f->len;
    t->backlog_bytes -= f->len;
    /* Progress: the stall is counted again from now, or ends. */
    c->stalled_since_ms = c->head ? now_ms : 0;
    return f;
}

cl_client **cl_list(const cl_table *t, size_t *n)
{
    *n = 0;
    cl_client **v = t->n ? malloc(t->n * sizeof(*v)) : NULL;
    size_t pos = 0;
    uint64_t key;
    void *val;
    while (v && u64map_next(&t->by_hash, &pos, &key, &val))
        for (cl_client *c = val; c && *n < t->n; c = c->next)
            v[(*n)++] = c;
    return v;
}

/* One client's own sums: its backlog's frames, bytes, tail and stall. */
static int check_client(const cl_client *c, uint64_t *bytes, char *why, size_t len)
{
    size_t frames = 0;
    const cl_frame *last = NULL;
    *bytes = 0;
    for (const cl_frame *f = c->head; f; f = f->next) {
        frames++;
        *bytes += f->len;
        last = f;
    }
    if (c->hkey != hash_identity(c->identity, c->identity_len))
        snprintf(why, len, "a client is filed under another identity's hash");
    else if (frames != c->n_backlog || *bytes != c->backlog_bytes)
        snprintf(why, len, "a client holds %zu replies of %llu bytes and counts %zu of %llu",
                 frames, (unsigned long long)*bytes, c->n_backlog,
                 (unsigned long long)c->backlog_bytes);
    else if (last != c->tail)
        snprintf(why, len, "a client's backlog tail is not its last reply");
    else if ((c->stalled_since_ms != 0) != (c->head != NULL))
        snprintf(why, len, "a client %s a backlog and %s a stall time",
                 c->head ? "has" : "has no", c->stalled_since_ms ? "has" : "has no");
    else
        return 0;
    return -1;
}

int cl_check(const cl_table *t, char *why, size_t len)
{
    size_t n = 0, busy = 0, backlogged = 0, waiting = 0;
    uint64_t bytes = 0, key;
    size_t pos = 0;
    void *val;
    while (u64map_next(&t->by_hash, &pos, &key, &val))
        for (const cl_client *c = val; c; c = c->next) {
            uint64_t b;
            if (c->hkey != key) {
                snprintf(why, len, "a client is chained under another hash");
                return -1;
            }
            if (check_client(c, &b, why, len) < 0)
                return -1;
            n++;
            busy += c->inflight > 0;
            backlogged += c->head != NULL;
            bytes += b;
        }
    for (const cl_client *c = t->waiting, *prev = NULL; c; prev = c, c = c->wait_next) {
        if (!c->head || c->wait_prev != prev || ++waiting > n) {
            snprintf(why, len, "the list of clients with held replies is broken");
            return -1;
        }
    }
    if (n != t->n || busy != t->busy || bytes != t->backlog_bytes || waiting != backlogged) {
        snprintf(why, len, "the table counts %zu clients, %zu busy, %llu held bytes, and its "
                 "entries %zu, %zu busy, %llu bytes (%zu waiting of %zu with replies held)",
                 t->n, t->busy, (unsigned long long)t->backlog_bytes, n, busy,
                 (unsigned long long)bytes, waiting, backlogged);
        return -1;
    }
    return 0;
}

void cl_free(cl_table *t)
{
    size_t n;
    cl_client **v = cl_list(t, &n);
    for (size_t i = 0; i < n; i++)
        cl_remove(t, v[i]);
    free(v);
    u64map_free(&t->by_hash);
}
