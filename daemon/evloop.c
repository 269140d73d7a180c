#include "daemon/evloop.h"

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
    ev_entry *entries;
    zmq_pollitem_t *items; /* rebuilt when the set changes */
    size_t n;              /* entries (and items) in use, live or removed */
    size_t cap_entries, cap_items;
    bool dirty;
    bool stop;
    bool in_poll;
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
    /* Reuse a removed slot first so handles stay small. */
    for (size_t i = 0; i < l->n; i++) {
        if (!l->entries[i].live && !l->in_poll) {
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
    for (size_t i = 0; i < l->n; i++) {
        ev_entry *e = &l->entries[i];
        /* A removed entry polls nothing: fd -1 and no socket. */
        l->items[i] = (zmq_pollitem_t){e->live ? e->socket : NULL, e->live ? e->fd : -1,
                                       ZMQ_POLLIN, 0};
    }
    int n = zmq_poll(l->items, (int)l->n, timeout_ms);
    if (n < 0)
        return errno == EINTR ? 0 : BT_EIO;
    int ran = 0;
    l->in_poll = true;
    size_t count = l->n;
    for (size_t i = 0; i < count; i++) {
        if (!(l->items[i].revents & ZMQ_POLLIN) || !l->entries[i].live)
            continue;
        l->entries[i].cb(l, l->entries[i].arg);
        ran++;
    }
    l->in_poll = false;
    return ran;
}

void evloop_run(evloop *l)
{
    l->stop = false;
    while (!l->stop)
        evloop_run_once(l, 1000);
}

void evloop_stop(evloop *l)
{
    l->stop = true;
}
