/* A loaded config: look-ups, the built-in device profiles, the check of
 * runtime paths for --check-config, and destruction.  The bottom of the
 * config layers (load_internal.h): it calls none of the loaders. */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "config/config.h"
#include "config/load_internal.h"
#include "kernels/sched.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* The built-in profiles, as cfg_profile views of the scheduler's table
 * (kernels/sched.c, the one place their figures live), made on first use;
 * pthread_once keeps that first use safe from whichever thread comes. */
static cfg_profile builtin_profiles[8];
static size_t n_builtin_profiles;
static pthread_once_t builtin_once = PTHREAD_ONCE_INIT;

static void builtin_profiles_init(void)
{
    size_t n;
    const ks_profile *k = ks_profile_builtins(&n);
    for (size_t i = 0; i < n && i < N_OF(builtin_profiles); i++)
        builtin_profiles[n_builtin_profiles++] =
            (cfg_profile){(char *)k[i].name,        k[i].memory_bandwidth_gbps,
                          k[i].memory_efficiency,   k[i].tflops,
                          k[i].comm_bandwidth_gbps, k[i].comm_efficiency,
                          k[i].sync_overhead_us,    {0, 0}};
}

const cfg_profile *cfg__builtin_profiles(size_t *n)
{
    pthread_once(&builtin_once, builtin_profiles_init);
    *n = n_builtin_profiles;
    return builtin_profiles;
}

const cfg_profile *cfg__builtin_profile(const char *name)
{
    size_t n;
    const cfg_profile *all = cfg__builtin_profiles(&n);
    for (size_t i = 0; i < n; i++)
        if (strcmp(all[i].name, name) == 0)
            return &all[i];
    return NULL;
}

const cfg_profile *cfg_profile_find(const cfg_config *c, const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; c && i < c->n_profiles; i++)
        if (c->profiles[i].name && strcmp(c->profiles[i].name, name) == 0)
            return &c->profiles[i];
    return cfg__builtin_profile(name);
}

const cfg_profile *cfg_worker_profile(const cfg_config *c, const cfg_worker *w)
{
    if (w->profile)
        return cfg_profile_find(c, w->profile);
    return cfg_profile_find(c, w->cuda_index >= 0 ? "h100" : "cpu");
}

const cfg_worker *cfg_worker_find(const cfg_config *c, const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < c->n_workers; i++)
        if (c->workers[i].name && strcmp(c->workers[i].name, name) == 0)
            return &c->workers[i];
    return NULL;
}

const cfg_model *cfg_model_find(const cfg_config *c, const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < c->n_models; i++)
        if (c->models[i].name && strcmp(c->models[i].name, name) == 0)
            return &c->models[i];
    return NULL;
}

const cfg_option *cfg_model_option(const cfg_model *m, const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < m->n_options; i++)
        if (m->options[i].name && strcmp(m->options[i].name, name) == 0)
            return &m->options[i];
    return NULL;
}

/* ---- runtime paths ---- */

/* Warns at POS when PATH, the WHAT of model M, cannot be found; returns 1
 * when it warned. */
static int check_exists(bt_diag *d, cfg_pos pos, const cfg_model *m, const char *what,
                        const char *path)
{
    struct stat st;
    if (stat(path, &st) == 0)
        return 0;
    if (errno == ENOENT || errno == ENOTDIR)
        bt_diag_warn(d, pos.line, pos.col, "model '%s': %s '%s' does not exist%s", m->name, what,
                     path, path[0] == '/' ? "" : " (relative to the current directory)");
    else
        bt_diag_warn(d, pos.line, pos.col, "model '%s': %s '%s' cannot be checked: %s", m->name,
                     what, path, strerror(errno));
    return 1;
}

/* Whether batond could make folder DIR (it makes the folders of its ipc://
 * endpoints): its nearest existing ancestor is a folder this user may write. */
static bool can_make(const char *dir)
{
    char *p = strdup(dir);
    bool ok = false;
    while (p && *p) {
        struct stat st;
        if (stat(p, &st) == 0) {
            ok = S_ISDIR(st.st_mode) && access(p, W_OK | X_OK) == 0;
            break;
        }
        char *slash = strrchr(p, '/');
        if (!slash) {
            ok = access(".", W_OK | X_OK) == 0;
            break;
        }
        *slash = 0;
        if (slash == p) {                 /* up to the root */
            ok = access("/", W_OK | X_OK) == 0;
            break;
        }
    }
    free(p);
    return ok;
}

/* Warns when the folder of an ipc:// endpoint is missing and batond could
 * not make it: ZeroMQ cannot bind a socket file in a folder that does not
 * exist. */
static int check_ipc_folder(bt_diag *d, cfg_pos pos, const char *key, const char *ep)
{
    if (!ep || strncmp(ep, "ipc://", 6) != 0)
        return 0;
    const char *path = ep + 6;
    const char *slash = strrchr(path, '/');
    /* "@name" is Linux's abstract namespace: no file, no folder. */
    if (path[0] == '@' || !slash || slash == path)
        return 0;
    char *dir = strndup(path, (size_t)(slash - path));
    if (!dir)
        return 0;
    struct stat st;
    int warned = 0;
    if ((stat(dir, &st) != 0 && !can_make(dir)) || (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode))) {
        bt_diag_warn(d, pos.line, pos.col,
                     "the folder '%s' of %s '%s' does not exist, and this user cannot make "
                     "it%s", dir, key, ep,
                     dir[0] == '/' ? "" : " (relative to the current directory)");
        warned = 1;
    }
    free(dir);
    return warned;
}

int cfg_check_paths(const cfg_config *c, bt_diag *diag)
{
    int n = 0;
    n += check_ipc_folder(diag, c->daemon.pos, "listen", c->daemon.listen);
    n += check_ipc_folder(diag, c->daemon.pos, "workers_endpoint", c->daemon.workers_endpoint);
    for (size_t i = 0; i < c->n_models; i++) {
        const cfg_model *m = &c->models[i];
        /* A plugin named without a slash is looked up by dlopen's search
         * path, which a stat here cannot follow. */
        if (m->backend && strncmp(m->backend, "plugin:", 7) == 0 && strchr(m->backend + 7, '/'))
            n += check_exists(diag, m->pos, m, "plugin library", m->backend + 7);
        for (size_t j = 0; j < m->n_options; j++) {
            const cfg_option *o = &m->options[j];
            char what[96];
            if (o->type != BT_OPT_PATH || !o->v.s)
                continue;
            snprintf(what, sizeof(what), "option '%.64s', the file", o->name);
            n += check_exists(diag, o->pos, m, what, o->v.s);
        }
    }
    return n;
}

/* ---- destruction ---- */

void cfg__option_clear(cfg_option *o)
{
    free(o->name);
    if (o->type == BT_OPT_STRING || o->type == BT_OPT_PATH)
        free(o->v.s);
    memset(o, 0, sizeof(*o));
}

static void edges_free(cfg_edge *e, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(e[i].name);
        free(e[i].to);
        free(e[i].modality);
    }
    free(e);
}

static void strs_free(cfg_str *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(s[i].s);
    free(s);
}

void cfg__section_destroy(cfg_section *s)
{
    if (!s)
        return;
    switch (s->kind) {
    case CFG_SEC_NODE:
        free(s->u.node.name);
        free(s->u.node.model);
        free(s->u.node.mode);
        strs_free(s->u.node.inputs, s->u.node.n_inputs);
        edges_free(s->u.node.outputs, s->u.node.n_outputs);
        break;
    case CFG_SEC_LOOP:
        free(s->u.loop.name);
        cfg__section_destroy(s->u.loop.body);
        edges_free(s->u.loop.outputs, s->u.loop.n_outputs);
        edges_free(s->u.loop.accumulate, s->u.loop.n_accumulate);
        break;
    case CFG_SEC_SEQUENTIAL:
    case CFG_SEC_PARALLEL:
        for (size_t i = 0; i < s->u.list.n; i++)
            cfg__section_destroy(s->u.list.items[i]);
        free(s->u.list.items);
        break;
    }
    free(s);
}

void cfg_config_destroy(cfg_config *c)
{
    if (!c)
        return;
    free(c->file);
    free(c->daemon.listen);
    free(c->daemon.workers_endpoint);
    free(c->daemon.http_listen);
    free(c->daemon.log_level);
    for (size_t i = 0; i < c->n_profiles; i++)
        free(c->profiles[i].name);
    free(c->profiles);
    for (size_t i = 0; i < c->n_workers; i++) {
        free(c->workers[i].name);
        free(c->workers[i].device);
        free(c->workers[i].profile);
        free(c->workers[i].host);
        free(c->workers[i].peer_listen);
    }
    free(c->workers);
    for (size_t i = 0; i < c->n_openai; i++) {
        cfg_openai *o = &c->openai[i];
        free(o->model), free(o->graph), free(o->input), free(o->output), free(o->loop);
    }
    free(c->openai);
    for (size_t i = 0; i < c->n_models; i++) {
        cfg_model *m = &c->models[i];
        free(m->name);
        free(m->backend);
        strs_free(m->workers, m->n_workers);
        for (size_t j = 0; j < m->n_options; j++)
            cfg__option_clear(&m->options[j]);
        free(m->options);
    }
    free(c->models);
    for (size_t i = 0; i < c->n_graphs; i++) {
        cfg_graph *g = &c->graphs[i];
        free(g->name);
        strs_free(g->inputs, g->n_inputs);
        cfg__section_destroy(g->body);
    }
    free(c->graphs);
    free(c);
}
