/* Copies off the I/O thread (copier.h). */
#include "worker/copier.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"

struct wk_copier {
    wk_device *dev;               /* borrowed */
    wk_events *events;            /* borrowed */
    bool threaded;                /* a GPU device: jobs run on THREAD */
    pthread_t thread;
    bool started;
    void *stream;                 /* the thread's; owned */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    wk_copy_job *head, *tail;     /* [mu] queued */
    bool stop;                    /* [mu] */
};

/* Runs JOB on STREAM: waits for its mark, copies, waits for the copy. */
static void job_run(wk_copier *c, void *stream, wk_copy_job *job)
{
    job->status = wk_device_mark_sync(c->dev, job->wait, job->err, sizeof(job->err));
    if (!job->status && job->n)
        job->status = wk_device_copy(c->dev, stream, job->dst, job->src, job->n, job->err,
                                     sizeof(job->err));
}

static void *copier_main(void *arg)
{
    wk_copier *c = arg;
    wk_device_bind_thread(c->dev);
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stop && !c->head)
            pthread_cond_wait(&c->cv, &c->mu);
        wk_copy_job *jobs = c->head;
        c->head = c->tail = NULL;
        bool stop = c->stop;
        pthread_mutex_unlock(&c->mu);
        /* Even when stopping, what was queued runs: each job holds a
         * tensor pinned and a message its end frees. */
        for (wk_copy_job *j = jobs, *nx; j; j = nx) {
            nx = j->next;
            job_run(c, c->stream, j);
            wk_events_post(c->events, &j->ev);
        }
        pthread_mutex_lock(&c->mu);
        if (stop && !c->head)
            break;
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int wk_copier_create(wk_device *dev, wk_events *events, wk_copier **out, char *err,
                     size_t errlen)
{
    *out = NULL;
    wk_copier *c = calloc(1, sizeof(*c));
    if (!c)
        return bt_errorf(err, errlen, BT_ENOMEM, "out of memory");
    c->dev = dev;
    c->events = events;
    c->threaded = wk_device_space(dev) == WK_SPACE_CUDA;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    int rc = 0;
    if (c->threaded && (rc = wk_device_stream_create(dev, &c->stream, err, errlen)) == 0 &&
        pthread_create(&c->thread, NULL, copier_main, c) != 0)
        rc = bt_errorf(err, errlen, BT_ETHREAD, "cannot start the copy thread");
    if (rc) {
        wk_copier_destroy(c);
        return rc;
    }
    c->started = c->threaded;
    *out = c;
    return 0;
}

void wk_copier_stop(wk_copier *c)
{
    if (!c || !c->started)
        return;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    c->started = false;
}

void wk_copier_destroy(wk_copier *c)
{
    if (!c)
        return;
    wk_copier_stop(c);
    if (c->stream)
        wk_device_stream_destroy(c->dev, c->stream);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

bool wk_copier_threaded(const wk_copier *c)
{
    return c->threaded;
}

void wk_copier_submit(wk_copier *c, wk_copy_job *job)
{
    job->next = NULL;
    if (!c->threaded) {
        /* Host memory: the copy is a memcpy, made here, and so is the end. */
        job_run(c, NULL, job);
        job->ev.run(&job->ev);
        return;
    }
    pthread_mutex_lock(&c->mu);
    if (c->stop) {
        /* Too late: it fails at once, on this thread, as its end would. */
        pthread_mutex_unlock(&c->mu);
        job->status = BT_ESTATE;
        snprintf(job->err, sizeof(job->err), "the worker is stopping");
        job->ev.run(&job->ev);
        return;
    }
    if (c->tail)
        c->tail->next = job;
    else
        c->head = job;
    c->tail = job;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}
