/* The I/O thread's inbox (events.h). */
#include "worker/events.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"

struct wk_events {
    pthread_mutex_t mu;
    wk_event *head, *tail;        /* [mu] posted, not yet run */
    int fd;                       /* eventfd; owned */
    pthread_t owner;              /* [mu] wk_events_own's caller */
    bool has_owner;               /* [mu] */
};

int wk_events_create(wk_events **out)
{
    *out = NULL;
    wk_events *q = calloc(1, sizeof(*q));
    if (!q)
        return BT_ENOMEM;
    if ((q->fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
        free(q);
        return BT_EIO;
    }
    pthread_mutex_init(&q->mu, NULL);
    *out = q;
    return 0;
}

void wk_events_destroy(wk_events *q)
{
    if (!q)
        return;
    if (q->head)
        bt_warn("events never taken in by the I/O thread are dropped");
    close(q->fd);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

int wk_events_fd(const wk_events *q)
{
    return q->fd;
}

void wk_events_wake(wk_events *q)
{
    uint64_t one = 1;
    /* Cannot fail short of a counter overflow; the I/O thread resets it. */
    if (write(q->fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        bt_error("eventfd write: %s", strerror(errno));
}

void wk_events_post(wk_events *q, wk_event *ev)
{
    ev->next = NULL;
    pthread_mutex_lock(&q->mu);
    bool was_empty = !q->head;
    bool own = q->has_owner && pthread_equal(pthread_self(), q->owner);
    if (q->tail)
        q->tail->next = ev;
    else
        q->head = ev;
    q->tail = ev;
    pthread_mutex_unlock(&q->mu);
    /* Only the first event of a batch needs the wake-up: wk_events_run
     * reads the eventfd before it takes the list, so an event that found
     * the list not empty is taken by that same run.  A lane finishing a
     * batch of 32 items makes one system call, not 32. */
    if (was_empty && !own)
        wk_events_wake(q);
}

bool wk_events_run_posted(wk_events *q)
{
    pthread_mutex_lock(&q->mu);
    wk_event *ev = q->head;
    q->head = q->tail = NULL;
    pthread_mutex_unlock(&q->mu);
    bool any = ev != NULL;
    while (ev) {
        wk_event *nx = ev->next;
        ev->run(ev);
        ev = nx;
    }
    return any;
}

void wk_events_run(wk_events *q)
{
    uint64_t n;
    if (read(q->fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
        bt_error("eventfd read: %s", strerror(errno));
    wk_events_run_posted(q);
}

bool wk_events_pending(wk_events *q)
{
    pthread_mutex_lock(&q->mu);
    bool any = q->head != NULL;
    pthread_mutex_unlock(&q->mu);
    return any;
}

void wk_events_own(wk_events *q)
{
    pthread_mutex_lock(&q->mu);
    q->owner = pthread_self();
    q->has_owner = true;
    pthread_mutex_unlock(&q->mu);
}
