/* The deployment file into cfg_* structs: the entry points, the top level,
 * daemon, device profiles and workers.  The top of the config layers
 * (load_internal.h): models and graphs are load_model.c's and
 * load_graph.c's, the shared helpers load_util.c's.
 *
 * The walk reads the top-level keys in a fixed order (devices, workers,
 * models, graphs) whatever their order in the file, so that every
 * reference can be checked the moment it is read: a worker's profile, a
 * model's workers, a node's model.  Diagnostics are sorted by position at
 * the end, so they still read top to bottom. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/status.h"
#include "common/vec.h"
#include "config/config.h"
#include "config/load_internal.h"
#include "config/yaml_tree.h"
#include "kernels/sched.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* A config file is a few kilobytes; anything near this is a wrong path. */
#define CFG_MAX_FILE_BYTES (16u << 20)

/* Reports VALUE, read at V for KEY, unless it is one of CHOICES. */
static bool check_choice(cfg__loader *l, const yt_node *v, const char *key, const char *value,
                         const char *const *choices, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(value, choices[i]) == 0)
            return true;
    char list[128] = "";
    for (size_t i = 0; i < n; i++) {
        strncat(list, i ? ", " : "", sizeof(list) - strlen(list) - 1);
        strncat(list, choices[i], sizeof(list) - strlen(list) - 1);
    }
    const char *hint = bt_suggest(value, choices, n);
    if (hint)
        bt_diag_error(l->diag, v->line, v->col, "%s must be one of %s, got '%s'; did you mean '%s'?",
                      key, list, value, hint);
    else
        bt_diag_error(l->diag, v->line, v->col, "%s must be one of %s, got '%s'", key, list, value);
    return false;
}

/* ---- daemon ---- */

static void check_endpoint(cfg__loader *l, const yt_node *v, const char *key, const char *ep)
{
    if (strncmp(ep, "ipc://", 6) == 0 && ep[6])
        return;
    if (strncmp(ep, "tcp://", 6) == 0 && strchr(ep + 6, ':'))
        return;   /* whether it needs CURVE is check_transport's, once curve: is read */
    bt_diag_error(l->diag, v->line, v->col,
                  "%s must be an ipc:// path or a tcp://host:port endpoint, got '%s'", key, ep);
}

/* A tcp:// endpoint on another host than loopback carries requests, tensors
 * and worker commands in the clear to whoever can reach the port, and
 * anyone who can reach it may send them: it needs CURVE (daemon.curve), or
 * an explicit `insecure: true` for a network that is trusted as a whole. */
static void check_transport(cfg__loader *l, const yt_node *v, const char *key, const char *ep)
{
    const cfg_daemon *dm = &l->c->daemon;
    if (!cfg_endpoint_is_tcp(ep) || dm->curve)
        return;
    if (cfg_endpoint_is_loopback(ep))
        bt_diag_warn(l->diag, v->line, v->col,
                     "%s '%s' is a loopback TCP endpoint without CURVE: any local user can "
                     "connect to it; set daemon.curve or use an ipc:// socket", key, ep);
    else if (dm->insecure)
        bt_diag_warn(l->diag, v->line, v->col,
                     "insecure: %s '%s' is a TCP endpoint without CURVE: anyone who can "
                     "reach it can connect and read the traffic", key, ep);
    else
        bt_diag_error(l->diag, v->line, v->col,
                      "%s '%s' is a TCP endpoint beyond loopback and daemon.curve is not set: "
                      "set curve keys (docs/operations.md, Security), or 'insecure: true' "
                      "on a network trusted as a whole", key, ep);
}

/* daemon.curve: which key files batond uses.  The files themselves are
 * read by cfg_check_keys (config/config.c). */
static void load_curve(cfg__loader *l, const yt_node *v)
{
    static const char *const keys[] = {"secret_key", "public_key", "client_keys",
                                       "worker_keys"};
    const yt_node *f[N_OF(keys)];
    cfg_daemon *dm = &l->c->daemon;
    cfg_str *dst[] = {&dm->curve_secret_key, &dm->curve_public_key, &dm->curve_client_keys,
                      &dm->curve_worker_keys};

    if (!yt_expect(v, YT_MAP, "curve", l->diag))
        return;
    yt_fields(v, "curve", keys, N_OF(keys), f, l->diag);
    for (size_t i = 0; i < N_OF(keys); i++) {
        if (!f[i])
            continue;
        if (cfg__str(l, f[i], keys[i], &dst[i]->s) && !*dst[i]->s)
            bt_diag_error(l->diag, f[i]->line, f[i]->col, "curve %s is an empty path", keys[i]);
        dst[i]->pos = cfg__pos(f[i]);
    }
    if (!f[0])
        bt_diag_error(l->diag, v->line, v->col,
                      "curve has no 'secret_key' (batond's secret key file, made by "
                      "'batonctl keygen')");
    else
        dm->curve = true;
}

/* ipc_mode: octal permission bits, written 0660 (YAML may also read 0660
 * as a number, so the text of the scalar is parsed here). */
static void load_ipc_mode(cfg__loader *l, const yt_node *v)
{
    const char *t = v->kind == YT_SCALAR ? v->str : NULL;
    char *end = NULL;
    unsigned long m = 0;
    if (t && t[0] == '0' && (t[1] == 'o' || t[1] == 'O'))
        t += 2;
    if (t && *t && strspn(t, "01234567") == strlen(t))
        m = strtoul(t, &end, 8);
    if (!t || !end || *end || m > 0777 || !(m & 0600)) {
        bt_diag_error(l->diag, v->line, v->col,
                      "ipc_mode must be octal permission bits from 0600 to 0777 (e.g. 0660)");
        return;
    }
    l->c->daemon.ipc_mode = (uint32_t)m;
}

static void check_host_port(cfg__loader *l, const yt_node *v, const char *key, const char *hp)
{
    const char *colon = strrchr(hp, ':');
    int64_t port = 0;
    if (!colon || yt_parse_int(colon + 1, &port) != 0 || port < 1 || port > 65535 ||
        colon[1] == '+' || colon[1] == '-')
        bt_diag_error(l->diag, v->line, v->col, "%s must be host:port (port 1-65535), got '%s'",
                      key, hp);
}

static void load_daemon(cfg__loader *l, const yt_node *v)
{
    static const char *const keys[] = {
        "listen",           "workers_endpoint",  "metrics_listen",
        "max_inflight",     "request_timeout_ms", "drain_timeout_ms",
        "max_message_bytes", "speculation_window", "log_level",
        "http_listen",      "max_request_timeout_ms", "client_max_inflight",
        "client_max_reply_bytes", "client_stall_timeout_ms", "curve",
        "insecure",         "ipc_mode",          "ipc_group",
    };
    static const char *const levels[] = {"error", "warning", "info", "debug"};
    const yt_node *f[N_OF(keys)];
    cfg_daemon *dm = &l->c->daemon;

    if (!yt_expect(v, YT_MAP, "daemon", l->diag))
        return;
    dm->pos = cfg__pos(v);
    yt_fields(v, "daemon", keys, N_OF(keys), f, l->diag);
    if (f[14])
        load_curve(l, f[14]);
    if (f[15])
        yt_bool(f[15], "insecure", &dm->insecure, l->diag);
    if (f[16])
        load_ipc_mode(l, f[16]);
    if (f[17] && cfg__str(l, f[17], "ipc_group", &dm->ipc_group) && !*dm->ipc_group)
        bt_diag_error(l->diag, f[17]->line, f[17]->col, "ipc_group is an empty group name");
    if (f[0] && cfg__str(l, f[0], "listen", &dm->listen))
        check_endpoint(l, f[0], "listen", dm->listen);
    if (f[1] && cfg__str(l, f[1], "workers_endpoint", &dm->workers_endpoint))
        check_endpoint(l, f[1], "workers_endpoint", dm->workers_endpoint);
    /* The defaults are ipc://, so only endpoints given can be tcp. */
    if (f[0] && dm->listen)
        check_transport(l, f[0], "listen", dm->listen);
    if (f[1] && dm->workers_endpoint)
        check_transport(l, f[1], "workers_endpoint", dm->workers_endpoint);
    if (dm->insecure && dm->curve)
        bt_diag_warn(l->diag, f[15]->line, f[15]->col,
                     "insecure: true has no effect: daemon.curve is set, so every TCP "
                     "socket uses CURVE");
    /* metrics_listen is the older name of http_listen, from when the port
     * served /metrics alone. */
    if (f[2] && f[9])
        bt_diag_error(l->diag, f[2]->line, f[2]->col,
                      "metrics_listen is the older name of http_listen: give only one");
    else if (f[9] && cfg__str(l, f[9], "http_listen", &dm->http_listen))
        check_host_port(l, f[9], "http_listen", dm->http_listen);
    else if (f[2] && cfg__str(l, f[2], "metrics_listen", &dm->http_listen))
        check_host_port(l, f[2], "metrics_listen", dm->http_listen);
    if (f[3])
        yt_u32(f[3], "max_inflight", 1, 1u << 20, &dm->max_inflight, l->diag);
    if (f[4])
        yt_u32(f[4], "request_timeout_ms", 1, UINT32_MAX, &dm->request_timeout_ms, l->diag);
    if (f[5])
        yt_u32(f[5], "drain_timeout_ms", 0, UINT32_MAX, &dm->drain_timeout_ms, l->diag);
    if (f[6]) {
        /* Below a few KiB not even a short prompt fits; protobuf refuses
         * messages of 2 GiB or more. */
        int64_t x;
        if (yt_int(f[6], "max_message_bytes", 4096, INT32_MAX, &x, l->diag))
            dm->max_message_bytes = (uint64_t)x;
    }
    if (f[7])
        yt_u32(f[7], "speculation_window", 0, 4096, &dm->speculation_window, l->diag);
    if (f[8] && cfg__str(l, f[8], "log_level", &dm->log_level))
        check_choice(l, f[8], "log_level", dm->log_level, levels, N_OF(levels));
    if (f[10])
        yt_u32(f[10], "max_request_timeout_ms", 1, UINT32_MAX, &dm->max_request_timeout_ms,
               l->diag);
    if (f[11])
        yt_u32(f[11], "client_max_inflight", 1, 1u << 20, &dm->client_max_inflight, l->diag);
    if (f[12]) {
        /* Below 64 KiB one streamed answer would not fit. */
        int64_t x;
        if (yt_int(f[12], "client_max_reply_bytes", 65536, INT64_C(1) << 40, &x, l->diag))
            dm->client_max_reply_bytes = (uint64_t)x;
    }
    if (f[13])
        yt_u32(f[13], "client_stall_timeout_ms", 1, UINT32_MAX, &dm->client_stall_timeout_ms,
               l->diag);
}

/* ---- device profiles ---- */

static void load_profile(cfg__loader *l, const yt_node *v, cfg_profile *p)
{
    static const char *const keys[] = {
        "memory_bandwidth_gbps", "memory_efficiency", "tflops",
        "comm_bandwidth_gbps",   "comm_efficiency",   "sync_overhead_us",
    };
    const yt_node *f[N_OF(keys)];
    char ctx[96];

    const cfg_profile *def = ks_profile_builtin(p->name);
    if (def) {
        p->memory_bandwidth_gbps = def->memory_bandwidth_gbps;
        p->memory_efficiency = def->memory_efficiency;
        p->tflops = def->tflops;
        p->comm_bandwidth_gbps = def->comm_bandwidth_gbps;
        p->comm_efficiency = def->comm_efficiency;
        p->sync_overhead_us = def->sync_overhead_us;
    }
    snprintf(ctx, sizeof(ctx), "device profile '%.64s'", p->name);
    if (!yt_expect(v, YT_MAP, p->name, l->diag))
        return;
    yt_fields(v, ctx, keys, N_OF(keys), f, l->diag);
    /* Bandwidths and peaks are divisors in the cost model, so 0 is refused;
     * efficiencies are fractions of a peak. */
    double *dst[] = {&p->memory_bandwidth_gbps, &p->memory_efficiency, &p->tflops,
                     &p->comm_bandwidth_gbps,   &p->comm_efficiency,   &p->sync_overhead_us};
    static const double lo[] = {0.001, 0.01, 0.001, 0.001, 0.01, 0};
    static const double hi[] = {1e9, 1, 1e9, 1e9, 1, 1e9};
    for (size_t i = 0; i < N_OF(keys); i++) {
        if (f[i])
            yt_float(f[i], keys[i], lo[i], hi[i], dst[i], l->diag);
        else if (!def)
            bt_diag_warn(l->diag, v->line, v->col,
                         "%s does not set '%s' and no built-in profile of that name does; the "
                         "cost model will use 0",
                         ctx, keys[i]);
    }
}

static void load_devices(cfg__loader *l, const yt_node *v)
{
    cfg_config *c = l->c;
    cfg__names seen = {0};

    if (!yt_expect(v, YT_MAP, "devices", l->diag))
        return;
    c->profiles = cfg__calloc(l, v->n_pairs, sizeof(*c->profiles));
    if (!c->profiles)
        return;
    for (size_t i = 0; i < v->n_pairs; i++) {
        const yt_node *key = v->pairs[i].key;
        cfg_profile *p = &c->profiles[c->n_profiles];
        char *name = NULL;  /* cfg__str frees what *out held */
        if (!cfg__str(l, key, "devices", &name))
            continue;
        p->name = name;  /* owned by the config: cfg_config_destroy frees it */
        c->n_profiles++;
        cfg__names_add(l, &seen, p->name, cfg__pos(key), "profile");
        load_profile(l, v->pairs[i].value, p);
    }
    cfg__names_free(&seen);
}

/* ---- workers ---- */

/* "cpu" gives -1; "cuda:N" gives N; anything else BT_EINVAL. */
static int parse_device(const char *s, int *index)
{
    if (strcmp(s, "cpu") == 0) {
        *index = -1;
        return 0;
    }
    int64_t n;
    if (strncmp(s, "cuda:", 5) != 0 || s[5] < '0' || s[5] > '9' || yt_parse_int(s + 5, &n) != 0 ||
        n > 1023)
        return BT_EINVAL;
    *index = (int)n;
    return 0;
}

static void load_streams(cfg__loader *l, const yt_node *v, cfg_worker *w)
{
    static const char *const keys[] = {"compute", "comm"};
    const yt_node *f[N_OF(keys)];
    if (!yt_expect(v, YT_MAP, "streams", l->diag))
        return;
    yt_fields(v, "streams", keys, N_OF(keys), f, l->diag);
    if (f[0])
        yt_u32(f[0], "compute", 1, 64, &w->streams_compute, l->diag);
    if (f[1])
        yt_u32(f[1], "comm", 0, 64, &w->streams_comm, l->diag);
}

/* A name a worker may report as its host: what gethostname gives, and
 * short enough for the conductor's record of it. */
static bool host_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 63)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '.' || *s == '-' || *s == '_'))
            return false;
    return true;
}

/* "tcp://ADDR:PORT" with a non-empty ADDR and PORT 1..65535 or "*". */
static bool peer_listen_ok(const char *s)
{
    if (strncmp(s, "tcp://", 6) != 0)
        return false;
    const char *addr = s + 6, *colon = strrchr(addr, ':');
    if (!colon || colon == addr || strlen(s) > 200)
        return false;
    const char *port = colon + 1;
    if (strcmp(port, "*") == 0)
        return true;
    char *end;
    long v = strtol(port, &end, 10);
    return *port && !*end && v >= 1 && v <= 65535;
}

/* Whether a valid peer_listen binds a wildcard address ("*", 0.0.0.0,
 * [::]), which peers on other hosts could not connect to. */
static bool peer_listen_wildcard(const char *s)
{
    const char *addr = s + 6;
    size_t n = (size_t)(strrchr(addr, ':') - addr);
    return (n == 1 && addr[0] == '*') || (n == 7 && strncmp(addr, "0.0.0.0", 7) == 0) ||
           (n == 4 && strncmp(addr, "[::]", 4) == 0);
}

/* A TCP endpoint that binds: its address and its port (0: none to clash
 * with, such as an ephemeral "*"). */
typedef struct bound_port {
    char addr[208];
    long port;
} bound_port;

/* Reads "tcp://ADDR:PORT" (TCP true) or "ADDR:PORT" (http_listen). */
static bound_port bound_port_of(const char *ep, bool tcp)
{
    bound_port b = {"", 0};
    if (!ep || (tcp && strncmp(ep, "tcp://", 6) != 0))
        return b;
    const char *addr = tcp ? ep + 6 : ep, *colon = strrchr(addr, ':');
    if (!colon || (size_t)(colon - addr) >= sizeof(b.addr))
        return b;
    char *end;
    long v = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || v < 1 || v > 65535)
        return b;
    memcpy(b.addr, addr, (size_t)(colon - addr));
    b.addr[colon - addr] = 0;
    b.port = v;
    return b;
}

static bool addr_wildcard(const char *a)
{
    return !strcmp(a, "*") || !strcmp(a, "0.0.0.0") || !strcmp(a, "[::]") || !strcmp(a, "::");
}

/* Whether binding A and binding B on one host would clash: one port, and
 * the same address or a wildcard on either side. */
static bool ports_clash(const bound_port *a, const bound_port *b)
{
    return a->port && a->port == b->port &&
           (!strcmp(a->addr, b->addr) || addr_wildcard(a->addr) || addr_wildcard(b->addr));
}

/* The host worker W binds on: its host:, batond's ("") for a spawned one
 * without host:, or NULL when not known (an external one without host:). */
static const char *worker_host(const cfg_worker *w)
{
    return w->host ? w->host : w->spawn == CFG_SPAWN_AUTO ? "" : NULL;
}

/* A peer_listen port that another endpoint of the same host binds too:
 * batond's listen, workers_endpoint and http_listen (on batond's host), or
 * another worker's peer_listen.  One of them would fail to bind at start;
 * the config says so now, at the peer_listen. */
static void check_port_clashes(cfg__loader *l)
{
    const cfg_config *c = l->c;
    const cfg_daemon *d = &c->daemon;
    struct {
        const char *key, *value;
        bound_port b;
    } own[3] = {{"daemon.listen", d->listen, bound_port_of(d->listen, true)},
                {"daemon.workers_endpoint", d->workers_endpoint,
                 bound_port_of(d->workers_endpoint, true)},
                {"daemon.http_listen", d->http_listen, bound_port_of(d->http_listen, false)}};
    for (size_t i = 0; i < c->n_workers; i++) {
        const cfg_worker *w = &c->workers[i];
        const char *host = worker_host(w);
        if (!w->peer_listen || !host)
            continue;
        bound_port b = bound_port_of(w->peer_listen, true);
        const cfg_pos *p = &w->peer_listen_pos;
        for (size_t k = 0; !host[0] && k < 3; k++)
            if (ports_clash(&b, &own[k].b))
                bt_diag_error(l->diag, p->line, p->col,
                              "worker '%s': peer_listen '%s' uses the port of %s '%s' on "
                              "batond's host: one of them cannot bind; give it another port",
                              w->name, w->peer_listen, own[k].key, own[k].value);
        for (size_t j = 0; j < i; j++) {
            const cfg_worker *o = &c->workers[j];
            bound_port ob = bound_port_of(o->peer_listen, true);
            if (worker_host(o) && !strcmp(worker_host(o), host) && ports_clash(&b, &ob))
                bt_diag_error(l->diag, p->line, p->col,
                              "worker '%s': peer_listen '%s' uses the port of worker '%s' "
                              "(peer_listen '%s') on the same host%s%s: one of them cannot bind; "
                              "give it another port", w->name, w->peer_listen, o->name,
                              o->peer_listen, host[0] ? " " : "", host);
        }
    }
}

static void load_worker(cfg__loader *l, const yt_node *v, cfg_worker *w, cfg__names *seen)
{
    static const char *const keys[] = {"name",    "device",  "profile", "pool_mb",
                                       "streams", "threads", "spawn",   "key",
                                       "host",    "peer_listen", "inline_us"};
    static const char *const spawns[] = {"auto", "external"};
    const yt_node *f[N_OF(keys)];
    char ctx[96];
    const char *peek = cfg__peek_name(v);

    w->pos = cfg__pos(v);
    w->cuda_index = -1;
    w->pool_mb = 512;
    w->streams_compute = 1;
    w->streams_comm = 1;
    w->threads = 1;
    w->inline_us = CFG_INLINE_US_DEFAULT;
    w->spawn = CFG_SPAWN_AUTO;
    snprintf(ctx, sizeof(ctx), peek ? "worker '%.64s'" : "a worker", peek);
    yt_fields(v, ctx, keys, N_OF(keys), f, l->diag);

    if (!f[0])
        bt_diag_error(l->diag, v->line, v->col, "%s has no 'name'", ctx);
    else if (cfg__str(l, f[0], "name", &w->name))
        cfg__names_add(l, seen, w->name, cfg__pos(f[0]), "worker");

    if (!f[1]) {
        bt_diag_error(l->diag, v->line, v->col, "%s has no 'device' (cpu or cuda:N)", ctx);
    } else if (cfg__str(l, f[1], "device", &w->device) &&
               parse_device(w->device, &w->cuda_index) != 0) {
        bt_diag_error(l->diag, f[1]->line, f[1]->col,
                      "device must be 'cpu' or 'cuda:N' (N from 0 to 1023), got '%s'", w->device);
    }

    if (f[2] && cfg__str(l, f[2], "profile", &w->profile) &&
        !cfg_profile_find(l->c, w->profile)) {
        const char *names[64];
        size_t n = 0;
        for (size_t i = 0; i < l->c->n_profiles && n < N_OF(names); i++)
            names[n++] = l->c->profiles[i].name;
        size_t n_builtin;
        const cfg_profile *builtin = ks_profile_builtins(&n_builtin);
        for (size_t i = 0; i < n_builtin && n < N_OF(names); i++)
            names[n++] = builtin[i].name;
        const char *hint = bt_suggest(w->profile, names, n);
        char list[128] = "";
        for (size_t i = 0, off = 0; i < n_builtin && off < sizeof(list); i++)
            off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%s", i ? ", " : "",
                                    builtin[i].name);
        bt_diag_error(l->diag, f[2]->line, f[2]->col,
                      "%s uses profile '%s', which is neither under devices: nor built in "
                      "(%s)%s%s%s",
                      ctx, w->profile, list, hint ? "; did you mean '" : "", hint ? hint : "",
                      hint ? "'?" : "");
    }
    if (f[3]) {
        /* 16 TiB: far beyond any device, small enough to multiply safely. */
        int64_t x;
        if (yt_int(f[3], "pool_mb", 1, INT64_C(1) << 24, &x, l->diag))
            w->pool_mb = (uint64_t)x;
    }
    if (f[4])
        load_streams(l, f[4], w);
    if (f[5])
        yt_u32(f[5], "threads", 1, 1024, &w->threads, l->diag);
    if (f[6]) {
        char *s = NULL;
        if (cfg__str(l, f[6], "spawn", &s) && check_choice(l, f[6], "spawn", s, spawns, 2))
            w->spawn = strcmp(s, "auto") == 0 ? CFG_SPAWN_AUTO : CFG_SPAWN_EXTERNAL;
        free(s);
    }
    if (f[7]) {
        w->key.pos = cfg__pos(f[7]);
        if (cfg__str(l, f[7], "key", &w->key.s) && !*w->key.s)
            bt_diag_error(l->diag, f[7]->line, f[7]->col, "%s: key is an empty path", ctx);
    }
    /* A worker batond spawns gets a fresh key pair from it at every spawn
     * (docs/operations.md, Security); a key file is for one started by
     * hand on another host. */
    const cfg_daemon *dm = &l->c->daemon;
    if (w->key.s && w->spawn == CFG_SPAWN_AUTO)
        bt_diag_warn(l->diag, f[7]->line, f[7]->col,
                     "%s: key is only used by a 'spawn: external' worker; batond gives the "
                     "workers it spawns a fresh key pair", ctx);
    else if (!w->key.s && w->spawn == CFG_SPAWN_EXTERNAL && dm->curve)
        /* Its key authenticates it to batond on a tcp workers_endpoint, and
         * to the other workers on the worker-to-worker sockets (which it
         * may use as a consumer even without a peer_listen of its own). */
        bt_diag_error(l->diag, v->line, v->col,
                      "%s is 'spawn: external' and daemon.curve is set: give it 'key:' (its "
                      "secret key file, made by 'batonctl keygen')",
                      ctx);
    if (f[8] && cfg__str(l, f[8], "host", &w->host) && !host_name_ok(w->host))
        bt_diag_error(l->diag, f[8]->line, f[8]->col,
                      "%s: host must be a host name (letters, digits, '.', '-', '_'; at most "
                      "63 characters), got '%s'", ctx, w->host);
    if (f[9] && cfg__str(l, f[9], "peer_listen", &w->peer_listen)) {
        w->peer_listen_pos = (cfg_pos){f[9]->line, f[9]->col};
        if (!peer_listen_ok(w->peer_listen))
            bt_diag_error(l->diag, f[9]->line, f[9]->col,
                          "%s: peer_listen must be tcp://ADDRESS:PORT with PORT a number from 1 "
                          "to 65535 or * (an ephemeral port), got '%s'", ctx, w->peer_listen);
        else if (peer_listen_wildcard(w->peer_listen))
            bt_diag_error(l->diag, f[9]->line, f[9]->col,
                          "%s: peer_listen '%s' binds every address, but it is also what the "
                          "worker advertises to its peers: name the address they reach it at",
                          ctx, w->peer_listen);
        else
            check_transport(l, f[9], "peer_listen", w->peer_listen);
    }
    if (f[10])
        yt_u32(f[10], "inline_us", 0, 1000000, &w->inline_us, l->diag);
}

static void load_workers(cfg__loader *l, const yt_node *v)
{
    cfg_config *c = l->c;

    if (!yt_expect(v, YT_SEQ, "workers", l->diag))
        return;
    c->workers = cfg__calloc(l, v->n_items, sizeof(*c->workers));
    if (!c->workers)
        return;
    for (size_t i = 0; i < v->n_items; i++)
        if (yt_expect(v->items[i], YT_MAP, "workers", l->diag))
            load_worker(l, v->items[i], &c->workers[c->n_workers++], &l->workers);
    check_port_clashes(l);
}

/* ---- openai ---- */

/* Whether section S streams a text value NAME to the client (a node's
 * new_token edge to the client with modality text), and whether it holds
 * a loop called LOOP (LOOP may be NULL). */
static void scan_section(const cfg_section *s, const char *name, const char *loop,
                         bool *has_text, bool *has_loop)
{
    if (!s)
        return;
    switch (s->kind) {
    case CFG_SEC_NODE:
        for (size_t i = 0; i < s->u.node.n_outputs; i++) {
            const cfg_edge *e = &s->u.node.outputs[i];
            const char *seen = e->as ? e->as : e->name;
            if (seen && strcmp(seen, name) == 0 && e->to && strcmp(e->to, "client") == 0 &&
                e->new_token && e->modality && strcmp(e->modality, "text") == 0)
                *has_text = true;
        }
        break;
    case CFG_SEC_LOOP:
        if (loop && s->u.loop.name && strcmp(s->u.loop.name, loop) == 0)
            *has_loop = true;
        scan_section(s->u.loop.body, name, loop, has_text, has_loop);
        break;
    default:
        for (size_t i = 0; i < s->u.list.n; i++)
            scan_section(s->u.list.items[i], name, loop, has_text, has_loop);
        break;
    }
}

/* An openai entry's second text stream NAME (a voice chat's transcript, a
 * transcription's segments), at key K: streamed by graph G to the client,
 * and not the answer's own (OTHER names that, WHAT says what it holds). */
static void second_stream(cfg__loader *l, const yt_node *k, const cfg_openai *o,
                          const cfg_graph *g, const char *name, const char *other,
                          const char *what)
{
    bool has_text = false, has_loop = false;
    scan_section(g->body, name, NULL, &has_text, &has_loop);
    if (!has_text || (o->output && strcmp(o->output, name) == 0))
        bt_diag_error(l->diag, k->line, k->col,
                      "openai model '%s': graph '%s' streams no text value '%s' to the client "
                      "apart from %s (an output with to: client, new_token: true, modality: "
                      "text, %s)", o->model ? o->model : "?", o->graph, name, other, what);
}

static void load_openai_one(cfg__loader *l, const yt_node *v, cfg_openai *o)
{
    static const char *const keys[] = {"model", "graph", "input",   "output",    "loop",
                                       "api",   "options", "transcript", "segments",
                                       "context"};
    const yt_node *f[N_OF(keys)];
    o->pos = cfg__pos(v);
    yt_fields(v, "an openai entry", keys, N_OF(keys), f, l->diag);
    for (size_t k = 0; k < 4; k++)
        if (!f[k])
            bt_diag_error(l->diag, v->line, v->col, "an openai entry has no '%s'", keys[k]);
    if (f[0] && cfg__str(l, f[0], "model", &o->model))
        for (const cfg_openai *p = l->c->openai; p < o; p++)
            if (p->model && strcmp(p->model, o->model) == 0)
                bt_diag_error(l->diag, f[0]->line, f[0]->col,
                              "openai model '%s' is listed twice", o->model);
    if (f[2])
        cfg__str(l, f[2], "input", &o->input);
    if (f[3])
        cfg__str(l, f[3], "output", &o->output);
    if (f[4])
        cfg__str(l, f[4], "loop", &o->loop);
    char *api = NULL;
    /* One error per mistake: a bad api or a missing options says so and
     * the inputs are not checked against it. */
    bool api_ok = true;
    if (f[5] && cfg__str(l, f[5], "api", &api)) {
        if (strcmp(api, "audio") == 0) {
            o->api = CFG_OPENAI_AUDIO;
        } else if (strcmp(api, "voice") == 0) {
            o->api = CFG_OPENAI_VOICE;
        } else if (strcmp(api, "chat") != 0) {
            bt_diag_error(l->diag, f[5]->line, f[5]->col,
                          "openai model '%s': api '%s' is chat (the default), audio or voice",
                          o->model ? o->model : "?", api);
            api_ok = false;
        }
    }
    free(api);
    if (f[6])
        cfg__str(l, f[6], "options", &o->options);
    if (f[7])
        cfg__str(l, f[7], "transcript", &o->transcript);
    if (f[8])
        cfg__str(l, f[8], "segments", &o->segments);
    if (f[9])
        cfg__str(l, f[9], "context", &o->context);
    const char *api_name = o->api == CFG_OPENAI_AUDIO ? "audio" : "voice";
    if (api_ok && o->api != CFG_OPENAI_CHAT && !o->options) {
        bt_diag_error(l->diag, v->line, v->col,
                      "openai model '%s': api %s needs 'options', the graph input that takes "
                      "the request's options as JSON", o->model ? o->model : "?", api_name);
        api_ok = false;
    } else if (api_ok && o->api == CFG_OPENAI_CHAT && f[6]) {
        bt_diag_error(l->diag, f[6]->line, f[6]->col,
                      "openai model '%s': 'options' is for api audio and voice",
                      o->model ? o->model : "?");
        api_ok = false;
    }
    if (api_ok && o->api == CFG_OPENAI_VOICE && !f[7]) {
        bt_diag_error(l->diag, v->line, v->col,
                      "openai model '%s': api voice needs 'transcript', the text stream of "
                      "what was heard", o->model ? o->model : "?");
        api_ok = false;
    } else if (api_ok && o->api != CFG_OPENAI_VOICE && f[7]) {
        bt_diag_error(l->diag, f[7]->line, f[7]->col,
                      "openai model '%s': 'transcript' is for api voice",
                      o->model ? o->model : "?");
        api_ok = false;
    }
    if (api_ok && o->api != CFG_OPENAI_AUDIO && f[8]) {
        bt_diag_error(l->diag, f[8]->line, f[8]->col,
                      "openai model '%s': 'segments' is for api audio", o->model ? o->model : "?");
        api_ok = false;
    }
    if (api_ok && o->api != CFG_OPENAI_VOICE && f[9]) {
        bt_diag_error(l->diag, f[9]->line, f[9]->col,
                      "openai model '%s': 'context' is for api voice", o->model ? o->model : "?");
        api_ok = false;
    }
    if (f[1] && cfg__str(l, f[1], "graph", &o->graph)) {
        /* A graph whose name was missing or mistyped is already an error
         * of its own; it matches no openai entry. */
        const cfg_graph *g = NULL;
        for (size_t i = 0; i < l->c->n_graphs && !g; i++)
            if (l->c->graphs[i].name && strcmp(l->c->graphs[i].name, o->graph) == 0)
                g = &l->c->graphs[i];
        if (!g) {
            bt_diag_error(l->diag, f[1]->line, f[1]->col,
                          "openai model '%s' uses graph '%s', which is not defined",
                          o->model ? o->model : "?", o->graph);
        } else if (o->input && api_ok) {
            /* A chat graph takes the text alone; an audio graph the file
             * and the options; a voice graph may take earlier turns too. */
            bool found = false, opts = !o->options, ctx = !o->context;
            for (size_t i = 0; i < g->n_inputs; i++) {
                found |= strcmp(g->inputs[i].s, o->input) == 0;
                opts |= o->options && strcmp(g->inputs[i].s, o->options) == 0;
                ctx |= o->context && strcmp(g->inputs[i].s, o->context) == 0;
            }
            size_t want = (o->options ? 2 : 1) + (o->context ? 1 : 0);
            bool same = (o->options && !strcmp(o->input, o->options)) ||
                        (o->context && (!strcmp(o->input, o->context) ||
                                        (o->options && !strcmp(o->options, o->context))));
            if (!found || !opts || !ctx || g->n_inputs != want || same)
                bt_diag_error(l->diag, f[2]->line, f[2]->col,
                              o->context ? "openai model '%s': graph '%s' must have exactly three "
                                           "inputs, '%s', '%s' and '%s'"
                              : o->options ? "openai model '%s': graph '%s' must have exactly two "
                                             "inputs, '%s' and '%s'%s"
                                           : "openai model '%s': graph '%s' must have exactly one "
                                             "input, '%s'%s%s",
                              o->model ? o->model : "?", o->graph, o->input,
                              o->options ? o->options : "", o->context ? o->context : "");
            /* The gateway sends the earlier turns only when there are some:
             * a question alone leaves the input out. */
            bool optional = false;
            for (size_t i = 0; o->context && i < g->n_optional; i++)
                optional |= strcmp(g->optional[i].s, o->context) == 0;
            if (o->context && ctx && !optional)
                bt_diag_error(l->diag, f[9]->line, f[9]->col,
                              "openai model '%s': input '%s' of graph '%s' takes the earlier "
                              "turns, which a request may not have: list it in the graph's "
                              "optional_inputs", o->model ? o->model : "?", o->context, o->graph);
        }
        bool has_text = false, has_loop = false;
        if (g && o->output) {
            scan_section(g->body, o->output, o->loop, &has_text, &has_loop);
            if (!has_text)
                bt_diag_error(l->diag, f[3]->line, f[3]->col,
                              "openai model '%s': graph '%s' streams no text value '%s' to the "
                              "client (an output with to: client, new_token: true, modality: "
                              "text)", o->model ? o->model : "?", o->graph, o->output);
            if (o->loop && !has_loop)
                bt_diag_error(l->diag, f[4]->line, f[4]->col,
                              "openai model '%s': graph '%s' has no loop '%s'",
                              o->model ? o->model : "?", o->graph, o->loop);
        }
        if (g && o->transcript && api_ok)
            second_stream(l, f[7], o, g, o->transcript, "the answer's",
                          "and a name of its own: `as`");
        if (g && o->segments && api_ok)
            second_stream(l, f[8], o, g, o->segments, "the text's",
                          "holding the segments' JSON lines");
    }
}

static void load_openai(cfg__loader *l, const yt_node *v)
{
    cfg_config *c = l->c;
    if (!yt_expect(v, YT_SEQ, "openai", l->diag))
        return;
    c->openai = cfg__calloc(l, v->n_items, sizeof(*c->openai));
    if (!c->openai)
        return;
    for (size_t i = 0; i < v->n_items; i++)
        if (yt_expect(v->items[i], YT_MAP, "openai", l->diag))
            load_openai_one(l, v->items[i], &c->openai[c->n_openai++]);
}

/* ---- the file ---- */

static void load_root(cfg__loader *l, const yt_node *root)
{
    static const char *const keys[] = {"version", "daemon", "devices",
                                       "workers", "models", "graphs", "openai"};
    const yt_node *f[N_OF(keys)];

    if (!root || yt_is_null(root)) {
        bt_diag_error(l->diag, 1, 1, "the file is empty; a config starts with 'version: 1'");
        return;
    }
    if (root->kind != YT_MAP) {
        char got[64];
        bt_diag_error(l->diag, root->line, root->col,
                      "expected a mapping at the top level (version, daemon, workers, ...), got %s",
                      yt_describe(root, got, sizeof(got)));
        return;
    }
    yt_fields(root, "the top-level mapping", keys, N_OF(keys), f, l->diag);
    if (!f[0]) {
        bt_diag_error(l->diag, root->line, root->col, "the file has no 'version'; add 'version: 1'");
    } else if (yt_u32(f[0], "version", 0, UINT32_MAX, &l->c->version, l->diag) &&
               l->c->version != 1) {
        bt_diag_error(l->diag, f[0]->line, f[0]->col,
                      "unsupported version %" PRIu32 "; this baton reads version 1",
                      l->c->version);
    }
    if (f[1])
        load_daemon(l, f[1]);
    if (f[2])
        load_devices(l, f[2]);
    if (f[3])
        load_workers(l, f[3]);
    if (f[4])
        cfg__load_models(l, f[4]);
    if (f[5])
        cfg__load_graphs(l, f[5]);
    if (f[6])
        load_openai(l, f[6]);
}

static cfg_config *config_create(const char *name)
{
    cfg_config *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    cfg_daemon *d = &c->daemon;
    c->file = strdup(name ? name : "<string>");
    d->listen = strdup("ipc:///run/baton/baton.sock");
    d->workers_endpoint = strdup("ipc:///run/baton/workers.sock");
    d->log_level = strdup("info");
    d->max_inflight = 256;
    d->request_timeout_ms = 60000;
    d->drain_timeout_ms = 10000;
    d->max_message_bytes = UINT64_C(64) << 20;
    d->speculation_window = 8;
    d->max_request_timeout_ms = 600000;
    d->client_max_inflight = 64;
    d->client_max_reply_bytes = UINT64_C(64) << 20;
    d->client_stall_timeout_ms = 30000;
    d->ipc_mode = 0660;
    if (!c->file || !d->listen || !d->workers_endpoint || !d->log_level) {
        cfg_config_destroy(c);
        return NULL;
    }
    return c;
}

int cfg_load_string(const char *yaml, size_t len, const char *name, bt_diag *diag,
                    cfg_config **out)
{
    size_t errors_before = diag->n_errors;
    yt_node *root = NULL;
    yt_error err;
    int rc;

    *out = NULL;
    cfg_config *c = config_create(name);
    if (!c)
        return BT_ENOMEM;
    rc = yt_parse(yaml, len, &root, &err);
    if (rc == BT_EINVAL) {
        bt_diag_error(diag, err.line, err.col, "%s", err.message);
        rc = BT_ECONFIG;
        goto err;
    }
    if (rc)
        goto err;

    cfg__loader l = {diag, c, 0, {0}, {0}};
    load_root(&l, root);
    cfg__names_free(&l.workers);
    cfg__names_free(&l.models);
    yt_node_destroy(root);
    root = NULL;
    bt_diag_sort(diag);
    if (l.rc) {
        rc = l.rc;
        goto err;
    }
    if (diag->n_errors > errors_before) {
        rc = BT_ECONFIG;
        goto err;
    }
    *out = c;
    return 0;

err:
    yt_node_destroy(root);
    cfg_config_destroy(c);
    return rc;
}

int cfg_load_file(const char *path, bt_diag *diag, cfg_config **out)
{
    char *buf = NULL;
    size_t len = 0;
    int rc;

    *out = NULL;
    FILE *f = fopen(path, "re");
    if (!f)
        goto io_err;
    struct stat st;
    if (fstat(fileno(f), &st) != 0)
        goto io_err;
    if (st.st_size > (off_t)CFG_MAX_FILE_BYTES) {
        bt_diag_error(diag, 0, 0, "%s is larger than %u MiB; is it a config file?", path,
                      CFG_MAX_FILE_BYTES >> 20);
        rc = BT_ECONFIG;
        goto err;
    }
    /* Read to the end rather than trusting st_size: a pipe or /proc file
     * reports 0. */
    size_t cap = (size_t)st.st_size + 1;
    buf = malloc(cap);
    if (!buf) {
        rc = BT_ENOMEM;
        goto err;
    }
    for (;;) {
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f))
                goto io_err;
            break;
        }
        if (len == cap) {
            if (cap > CFG_MAX_FILE_BYTES) {
                bt_diag_error(diag, 0, 0, "%s is larger than %u MiB; is it a config file?", path,
                              CFG_MAX_FILE_BYTES >> 20);
                rc = BT_ECONFIG;
                goto err;
            }
            if (BT_RESERVE(buf, len, cap, 1) < 0) {
                rc = BT_ENOMEM;
                goto err;
            }
        }
    }
    fclose(f);
    f = NULL;
    rc = cfg_load_string(buf, len, path, diag, out);
    free(buf);
    return rc;

io_err:
    bt_diag_error(diag, 0, 0, "cannot read %s: %s", path, strerror(errno));
    rc = BT_EIO;
err:
    free(buf);
    if (f)
        fclose(f);
    return rc;
}
