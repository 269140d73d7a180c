#include "common/evloop.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <zmq.h>

#include "common/status.h"
#include "common/vec.h"

typedef struct ev_entry {
    void *socket;
    int fd;
    evloop_cb cb;
    void *arg;
    bool live;
} ev_entry;

struct evloop {
    ev_entry *entries;            /* owned; index = handle */
    zmq_pollitem_t *items;        /* owned; what zmq_poll reads, one per entry */
    size_t n;                     /* entries (and items) in use, live or removed */
    size_t cap_entries, cap_items;
    bool dirty;                   /* entries changed since items were built */
    bool stop;
    bool in_poll;                 /* callbacks are running: slots are not reused */
};

evloop *evloop_create(void)
{
    return calloc(1, sizeof(evloop));
}

void evloop_destroy(evloop *l)
{
    if (!l)
        return;
    free(l->entries);
    free(l->items);
    free(l);
}

int evloop_add(evloop *l, void *socket, int fd, evloop_cb cb, void *arg)
{
    /* Reuse a removed slot first so handles stay small; never while the
     * callbacks of a round run, since the round may still read the slot. */
    for (size_t i = 0; i < l->n && !l->in_poll; i++) {
        if (!l->entries[i].live) {
            l->entries[i] = (ev_entry){socket, fd, cb, arg, true};
            l->dirty = true;
            return (int)i;
        }
    }
    if (BT_RESERVE(l->entries, l->n, l->cap_entries, 16) < 0 ||
        BT_RESERVE(l->items, l->n, l->cap_items, 16) < 0)
        return BT_ENOMEM;
    l->entries[l->n] = (ev_entry){socket, fd, cb, arg, true};
    l->dirty = true;
    return (int)l->n++;
}

void evloop_remove(evloop *l, int handle)
{
    if (handle < 0 || (size_t)handle >= l->n)
        return;
    l->entries[handle].live = false;
    l->dirty = true;
}

int evloop_run_once(evloop *l, long timeout_ms)
{
    /* The poll set is rebuilt only when a watcher came or went: zmq_poll
     * resets every revents itself, so an unchanged set is polled as it is. */
    if (l->dirty) {
        for (size_t i = 0; i < l->n; i++) {
            ev_entry *e = &l->entries[i];
            /* A removed entry polls nothing: fd -1 and no socket. */
            l->items[i] = (zmq_pollitem_t){e->live ? e->socket : NULL, e->live ? e->fd : -1,
                                           ZMQ_POLLIN, 0};
        }
        l->dirty = false;
    }
    int n = zmq_poll(l->items, (int)l->n, timeout_ms);
    if (n < 0)
        return errno == EINTR ? 0 : BT_EIO;
    int ran = 0;
    l->in_poll = true;
    l->stop = false;
    size_t count = l->n;
    for (size_t i = 0; i < count && n > 0 && !l->stop; i++) {
        if (!(l->items[i].revents & ZMQ_POLLIN))
            continue;
        n--;
        if (!l->entries[i].live)
            continue;
        l->entries[i].cb(l, l->entries[i].arg);
        ran++;
    }
    l->in_poll = false;
    return ran;
}

void evloop_run(evloop *l)
{
    do
        evloop_run_once(l, 1000);
    while (!l->stop);
}

void evloop_stop(evloop *l)
{
    l->stop = true;
}
