/* A loaded config: look-ups (a device profile not under devices: is the
 * scheduler's built-in one), the check of runtime paths for
 * --check-config, and destruction.  The bottom of the
 * config layers (load_internal.h): it calls none of the loaders. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sys/stat.h>

#include "common/curve.h"
#include "config/config.h"
#include "config/load_internal.h"
#include "kernels/sched.h"

const cfg_profile *cfg_profile_find(const cfg_config *c, const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; c && i < c->n_profiles; i++)
        if (c->profiles[i].name && strcmp(c->profiles[i].name, name) == 0)
            return &c->profiles[i];
    /* The built-ins are the scheduler's table (kernels/sched.c), the one
     * place their figures live. */
    return ks_profile_builtin(name);
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

bool cfg_model_replicated(const cfg_model *m)
{
    return m->n_workers > 1 && m->tp <= 1;
}

const char *cfg_routing_name(cfg_routing r)
{
    static const char *const names[] = {"cache_aware", "least_loaded", "round_robin"};
    return (size_t)r < sizeof(names) / sizeof(names[0]) ? names[r] : NULL;
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

/* ---- transport and keys ---- */

bool cfg_endpoint_is_tcp(const char *endpoint)
{
    return endpoint && strncmp(endpoint, "tcp://", 6) == 0;
}

bool cfg_endpoint_is_loopback(const char *endpoint)
{
    if (!cfg_endpoint_is_tcp(endpoint))
        return false;
    const char *h = endpoint + 6, *colon = strrchr(h, ':');
    if (!colon)
        return false;
    char host[256];
    size_t n = (size_t)(colon - h);
    if (n >= sizeof(host))
        return false;
    memcpy(host, h, n);
    host[n] = 0;
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']') {
        memmove(host, host + 1, n - 2);
        host[n - 2] = 0;
    }
    if (strcmp(host, "localhost") == 0)
        return true;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6);
    return false;   /* "*", 0.0.0.0, an interface or host name: reachable from outside */
}

/* Adds ERR's sentence at POS as an error of KEY. */
static void key_error(bt_diag *diag, cfg_pos pos, const char *key, const char *err)
{
    bt_diag_error(diag, pos.line, pos.col, "curve %s: %s", key, err);
}

static int check_secret(bt_diag *diag, const cfg_str *path, const char *key)
{
    bt_curve_keypair k;
    char err[600];
    int rc = bt_curve_secret_load(path->s, &k, err, sizeof(err));
    bt_curve_keypair_wipe(&k);
    if (rc)
        key_error(diag, path->pos, key, err);
    return rc ? 1 : 0;
}

/* Reads the authorized-keys file PATH (the value of KEY) as batond will.
 * C non-NULL: the file is worker_keys, whose names must be `spawn:
 * external` workers of C: a key named for another name lets nobody in,
 * which is worth a warning. */
static int check_keyset(bt_diag *diag, const cfg_str *path, const char *key, const cfg_config *c)
{
    if (!path->s)
        return 0;
    bt_curve_keyset *set = bt_curve_keyset_create();
    char err[600];
    int line = 0;
    int rc = set ? bt_curve_keyset_load(set, path->s, &line, err, sizeof(err)) : BT_CURVE_ENOMEM;
    if (rc == BT_CURVE_ENOMEM)
        snprintf(err, sizeof(err), "out of memory");
    if (rc)
        key_error(diag, path->pos, key, err);
    for (size_t i = 0; rc == 0 && c && i < bt_curve_keyset_count(set); i++) {
        const char *name = bt_curve_keyset_name_at(set, i);
        const cfg_worker *w = *name ? cfg_worker_find(c, name) : NULL;
        if (*name && (!w || w->spawn != CFG_SPAWN_EXTERNAL))
            bt_diag_warn(diag, path->pos.line, path->pos.col,
                         "%s: %s names '%s', which is no `spawn: external` worker of this "
                         "config: that key can register as no worker", key, path->s, name);
    }
    bt_curve_keyset_destroy(set);
    return rc ? 1 : 0;
}

int cfg_server_public_key(const cfg_config *c, char *out, char *err, size_t errlen)
{
    const cfg_daemon *d = &c->daemon;
    char twin[4096];
    if (!d->curve) {
        snprintf(err, errlen, "daemon.curve is not set");
        return BT_CURVE_EINVAL;
    }
    if (d->curve_public_key.s)
        return bt_curve_public_load(d->curve_public_key.s, out, err, errlen);
    /* A worker host may hold only the .pub twin of batond's key (the
     * secret stays with batond); on batond's own host the secret derives
     * it. */
    if (bt_curve_twin_path(d->curve_secret_key.s, twin, sizeof(twin)) == 0 &&
        access(twin, R_OK) == 0)
        return bt_curve_public_load(twin, out, err, errlen);
    bt_curve_keypair k;
    int rc = bt_curve_secret_load(d->curve_secret_key.s, &k, err, errlen);
    if (rc == 0)
        memcpy(out, k.public_z85, BT_CURVE_Z85_SIZE);
    bt_curve_keypair_wipe(&k);
    return rc;
}

int cfg_check_keys(const cfg_config *c, const char *worker, bt_diag *diag)
{
    const cfg_daemon *d = &c->daemon;
    int n = 0;
    char err[600];
    if (!worker) {
        if (!d->curve)
            return 0;
        if (!bt_curve_available()) {
            bt_diag_error(diag, d->curve_secret_key.pos.line, d->curve_secret_key.pos.col,
                          "daemon.curve is set but this libzmq was built without CURVE");
            return 1;
        }
        n += check_secret(diag, &d->curve_secret_key, "secret_key");
        if (n == 0 && d->curve_public_key.s) {
            bt_curve_keypair k;
            char pub[BT_CURVE_Z85_SIZE];
            int rc = bt_curve_public_load(d->curve_public_key.s, pub, err, sizeof(err));
            if (rc == 0 && bt_curve_secret_load(d->curve_secret_key.s, &k, err, sizeof(err)) == 0 &&
                strcmp(k.public_z85, pub) != 0) {
                snprintf(err, sizeof(err), "%s is not the public key of secret_key %s",
                         d->curve_public_key.s, d->curve_secret_key.s);
                rc = BT_CURVE_EMISMATCH;
            }
            bt_curve_keypair_wipe(&k);
            if (rc) {
                key_error(diag, d->curve_public_key.pos, "public_key", err);
                n++;
            }
        }
        n += check_keyset(diag, &d->curve_client_keys, "client_keys", NULL);
        n += check_keyset(diag, &d->curve_worker_keys, "worker_keys", c);
        return n;
    }
    const cfg_worker *w = cfg_worker_find(c, worker);
    if (!w || !d->curve || !cfg_endpoint_is_tcp(d->workers_endpoint))
        return 0;
    char pub[BT_CURVE_Z85_SIZE];
    if (cfg_server_public_key(c, pub, err, sizeof(err)) != 0) {
        cfg_pos pos = d->curve_public_key.s ? d->curve_public_key.pos : d->curve_secret_key.pos;
        bt_diag_error(diag, pos.line, pos.col,
                      "batond's public key for worker '%s': %s (give it as curve public_key)",
                      worker, err);
        n++;
    }
    if (w->key.s) {
        bt_curve_keypair k;
        int rc = bt_curve_secret_load(w->key.s, &k, err, sizeof(err));
        bt_curve_keypair_wipe(&k);
        if (rc) {
            bt_diag_error(diag, w->key.pos.line, w->key.pos.col, "worker '%s' key: %s", worker,
                          err);
            n++;
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
        free(e[i].as);
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
    free(c->daemon.curve_secret_key.s);
    free(c->daemon.curve_public_key.s);
    free(c->daemon.curve_client_keys.s);
    free(c->daemon.curve_worker_keys.s);
    free(c->daemon.ipc_group);
    for (size_t i = 0; i < c->n_profiles; i++)
        free((char *)c->profiles[i].name);  /* the config's own copy */
    free(c->profiles);
    for (size_t i = 0; i < c->n_workers; i++) {
        free(c->workers[i].name);
        free(c->workers[i].device);
        free(c->workers[i].profile);
        free(c->workers[i].key.s);
        free(c->workers[i].host);
        free(c->workers[i].peer_listen);
    }
    free(c->workers);
    for (size_t i = 0; i < c->n_openai; i++) {
        cfg_openai *o = &c->openai[i];
        free(o->model), free(o->graph), free(o->input), free(o->output), free(o->loop);
        free(o->options);
        free(o->transcript);
        free(o->context);
        free(o->segments);
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
        strs_free(g->optional, g->n_optional);
        cfg__section_destroy(g->body);
    }
    free(c->graphs);
    free(c);
}
