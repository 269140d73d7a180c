/* The groups of tensor-parallel models (daemon/tpgroups.h). */
#include "daemon/tpgroups.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "common/utf8.h"

/* A tensor-parallel model's group: the communicator id its rank 0 made
 * (TpGroup), which the other ranks' Loads carry.  Forgotten whenever a
 * member is lost, since the whole group then starts over. */
typedef struct tpg_group {
    uint8_t id[128];
    size_t id_len;                /* 0: not known yet */
    uint32_t *sent;               /* per rank: registration of its worker that got a Load
                                     with this id (0: none); owned, NULL unless tp > 1 */
    int held_by;                  /* the worker (index) whose failed load holds the group's
                                     Loads back; -1: none */
    char held[320];               /* why, for the log and health */
} tpg_group;

struct tp_groups {
    const cfg_config *cfg;        /* borrowed */
    worker_set *ws;               /* borrowed */
    tpg_hooks hooks;
    tpg_group *groups;            /* per config model; owned */
};

int tpg_create(const cfg_config *cfg, worker_set *ws, const tpg_hooks *hooks, tp_groups **out)
{
    *out = NULL;
    tp_groups *t = calloc(1, sizeof(*t));
    if (!t)
        return BT_ENOMEM;
    t->cfg = cfg;
    t->ws = ws;
    t->hooks = *hooks;
    t->groups = calloc(cfg->n_models + 1, sizeof(*t->groups));
    if (!t->groups)
        goto err;
    for (size_t m = 0; m < cfg->n_models; m++) {
        t->groups[m].held_by = -1;
        if (cfg->models[m].tp > 1 &&
            !(t->groups[m].sent = calloc(cfg->models[m].n_workers, sizeof(uint32_t))))
            goto err;
    }
    *out = t;
    return 0;

err:
    tpg_destroy(t);
    return BT_ENOMEM;
}

void tpg_destroy(tp_groups *t)
{
    if (!t)
        return;
    for (size_t m = 0; t->groups && m < t->cfg->n_models; m++)
        free(t->groups[m].sent);
    free(t->groups);
    free(t);
}

/* W's rank in the group of tensor-parallel model MD, or -1 when MD is not
 * tensor parallel or W is none of its ranks. */
static int group_rank(const cfg_model *md, const sup_worker *w)
{
    for (size_t k = 0; md->tp > 1 && k < md->n_workers; k++)
        if (strcmp(md->workers[k].s, w->cfg->name) == 0)
            return (int)k;
    return -1;
}

/* The index of the tensor-parallel model called NAME that W is rank 0 of,
 * or -1: the only worker whose TpGroup and TpStep are taken. */
static int led_model(const tp_groups *t, const sup_worker *w, const char *name)
{
    for (size_t m = 0; m < t->cfg->n_models; m++)
        if (strcmp(t->cfg->models[m].name, name ? name : "") == 0)
            return group_rank(&t->cfg->models[m], w) == 0 ? (int)m : -1;
    return -1;
}

bool tpg_in_group(const tp_groups *t, const sup_worker *w)
{
    for (size_t m = 0; m < t->cfg->n_models; m++)
        if (group_rank(&t->cfg->models[m], w) >= 0)
            return true;
    return false;
}

const uint8_t *tpg_group_id(const tp_groups *t, size_t m, size_t *len)
{
    *len = t->groups[m].id_len;
    return t->groups[m].id;
}

bool tpg_waits(const tp_groups *t, size_t m, size_t k)
{
    return t->cfg->models[m].tp > 1 &&
           (t->groups[m].held_by >= 0 || (k > 0 && !t->groups[m].id_len));
}

const char *tpg_held(const tp_groups *t, size_t m)
{
    return t->groups[m].held_by >= 0 ? t->groups[m].held : NULL;
}

/* Forgets model M's communicator id and which ranks got it. */
static void forget_id(tp_groups *t, size_t m)
{
    tpg_group *g = &t->groups[m];
    g->id_len = 0;
    if (g->sent)
        memset(g->sent, 0, t->cfg->models[m].n_workers * sizeof(*g->sent));
}

void tpg_load_failed(tp_groups *t, sup_worker *w, const char *model, const char *why)
{
    for (size_t m = 0; m < t->cfg->n_models; m++) {
        const cfg_model *md = &t->cfg->models[m];
        int k = group_rank(md, w);
        if (k < 0 || strcmp(md->name, model ? model : "") != 0)
            continue;
        tpg_group *g = &t->groups[m];
        g->held_by = w->index;
        /* The worker's words, cut on a character and made UTF-8: they go
         * into health answers. */
        char text[600];
        why = why ? why : "";
        size_t n = bt_utf8_lossy(why, (size_t)bt_utf8_prefix(why, 190), text);
        snprintf(g->held, sizeof(g->held), "rank %d (worker %s) failed to load: %.*s", k,
                 w->cfg->name, (int)n, text);
        bt_error("model %s: its tensor-parallel group is held until worker %s registers again: "
                 "%s", md->name, w->cfg->name, g->held);
        forget_id(t, m);
        for (size_t r = 0; r < md->n_workers; r++) {
            sup_worker *x = workers_named(t->ws, md->workers[r].s);
            if (!x || x == w || !workers_live(x))
                continue;
            char reason[400];
            snprintf(reason, sizeof(reason), "its tensor-parallel group (model %s) cannot form: "
                     "%s", md->name, g->held);
            t->hooks.take_down(t->hooks.arg, x, reason);
        }
    }
}

void tpg_registered(tp_groups *t, sup_worker *w)
{
    for (size_t m = 0; m < t->cfg->n_models; m++) {
        const cfg_model *md = &t->cfg->models[m];
        tpg_group *g = &t->groups[m];
        if (g->held_by != w->index)
            continue;
        g->held_by = -1;
        bt_info("model %s: worker %s registered again; its tensor-parallel group forms again",
                md->name, w->cfg->name);
        /* Rank 0 makes the id the others wait for; W itself gets its Load
         * as it registers. */
        sup_worker *x = workers_named(t->ws, md->workers[0].s);
        if (x && x != w && x->state == SUP_LOADING && g->sent[0] != x->registrations)
            t->hooks.load(t->hooks.arg, x, m, 0);
    }
}

void tpg_load_sent(tp_groups *t, size_t m, size_t k, uint32_t registration)
{
    if (t->groups[m].sent)
        t->groups[m].sent[k] = registration;
}

void tpg_on_group(tp_groups *t, sup_worker *w, const Baton__V1__TpGroup *tg)
{
    int m = led_model(t, w, tg->model);
    tpg_group *g = m >= 0 ? &t->groups[m] : NULL;
    if (!g || tg->comm_id.len == 0 || tg->comm_id.len > sizeof(g->id)) {
        bt_warn("worker %s sent a group id for model %s, of which it is not rank 0",
                w->cfg->name, tg->model ? tg->model : "?");
        return;
    }
    const cfg_model *md = &t->cfg->models[m];
    memcpy(g->id, tg->comm_id.data, tg->comm_id.len);
    g->id_len = tg->comm_id.len;
    for (size_t k = 1; k < md->n_workers; k++) {
        sup_worker *x = workers_named(t->ws, md->workers[k].s);
        if (x && x->state == SUP_LOADING && g->sent[k] != x->registrations)
            t->hooks.load(t->hooks.arg, x, (size_t)m, k);
    }
}

void tpg_on_step(tp_groups *t, sup_worker *w, const Baton__V1__TpStep *st)
{
    int m = led_model(t, w, st->model);
    if (m < 0) {
        bt_warn("worker %s sent a step of model %s, of which it is not rank 0", w->cfg->name,
                st->model ? st->model : "?");
        return;
    }
    const cfg_model *md = &t->cfg->models[m];
    Baton__V1__ConductorMessage cm = BATON__V1__CONDUCTOR_MESSAGE__INIT;
    cm.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_TP_STEP;
    cm.tp_step = (Baton__V1__TpStep *)st;
    for (size_t k = 1; k < md->n_workers; k++) {
        sup_worker *x = workers_named(t->ws, md->workers[k].s);
        /* A step a rank does not get leaves the others waiting for it in a
         * collective: the group starts over. */
        if (x && workers_live(x) && workers_send(t->ws, x->index, &cm) != 0)
            t->hooks.take_down(t->hooks.arg, x,
                               "a step of its tensor-parallel group could not be sent to it");
    }
}

void tpg_break(tp_groups *t, sup_worker *w)
{
    const cfg_config *cfg = t->cfg;
    for (size_t m = 0; m < cfg->n_models; m++) {
        const cfg_model *md = &cfg->models[m];
        if (group_rank(md, w) < 0)
            continue;
        forget_id(t, m);
        for (size_t k = 0; k < md->n_workers; k++) {
            sup_worker *x = workers_named(t->ws, md->workers[k].s);
            /* The rank whose failed load holds the group waits in no
             * collective: taking it down would restart it, and its
             * registration would release the group into the same failure,
             * again and again. */
            if (!x || x == w || !workers_live(x) || x->index == t->groups[m].held_by)
                continue;
            char why[160];
            snprintf(why, sizeof(why), "worker %s of its tensor-parallel group (model %s) was "
                     "lost", w->cfg->name, md->name);
            t->hooks.take_down(t->hooks.arg, x, why);
        }
    }
}
