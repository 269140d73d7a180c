/* The deployment file (config/README.md) loaded into typed structs.
 *
 * cfg_load parses YAML with libyaml and checks the schema: key names (with
 * a "did you mean"), value types, ranges, duplicate names, references from
 * models to workers and profiles, backends and their options.  It does not
 * check graph semantics (edges, loops, producers): graph_build does that
 * from these structs.  Every struct records where it stood in the file, so
 * later passes report errors at the right line. */
#ifndef BATON_CONFIG_CONFIG_H
#define BATON_CONFIG_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "baton/backend.h"
#include "backends/catalog.h"
#include "common/diag.h"

typedef struct cfg_pos {
    int line, col; /* 1-based position of the item's first character */
} cfg_pos;

/* A string with the place it was read from. */
typedef struct cfg_str {
    char *s; /* owned */
    cfg_pos pos;
} cfg_str;

typedef struct cfg_daemon {
    char *listen;               /* client endpoint; default ipc:///run/baton/baton.sock */
    char *workers_endpoint;     /* default ipc:///run/baton/workers.sock */
    char *http_listen;          /* host:port of the HTTP API (/health, /metrics, /v1), or
                                 * NULL; the key is http_listen, or metrics_listen (older) */
    uint32_t max_inflight;      /* requests; default 256 */
    uint32_t request_timeout_ms;/* default 60000 */
    uint32_t drain_timeout_ms;  /* default 10000 */
    uint64_t max_message_bytes; /* default 64 MiB */
    uint32_t speculation_window;/* iterations; default 8 */
    uint32_t max_request_timeout_ms; /* a request's timeout_ms is clamped to it; default 600000 */
    uint32_t client_max_inflight;    /* requests one client connection may have accepted at
                                      * once; default 64 */
    uint64_t client_max_reply_bytes; /* reply bytes held for one connection that does not
                                      * read; past it its new requests are refused; default
                                      * 64 MiB */
    uint32_t client_stall_timeout_ms;/* a connection that reads none of its held replies this
                                      * long is dropped; default 30000 */
    char *log_level;            /* error|warning|info|debug; default info */
    /* daemon.curve: CURVE on the tcp:// sockets (docs/operations.md,
     * "Security").  Each path is owned, NULL when not given, and keeps
     * where it stood for the errors of cfg_check_keys. */
    bool curve;                 /* a `curve:` map with a secret_key was given */
    cfg_str curve_secret_key;   /* batond's secret key file (NAME.key) */
    cfg_str curve_public_key;   /* its public key file, for hosts without the secret */
    cfg_str curve_client_keys;  /* authorized client public keys, one a line */
    cfg_str curve_worker_keys;  /* authorized worker public keys, one a line */
    bool insecure;              /* a non-loopback tcp endpoint without curve is allowed */
    uint32_t ipc_mode;          /* permission bits of ipc:// socket files; default 0660 */
    char *ipc_group;            /* group of ipc:// socket files, or NULL: batond's own */
    cfg_pos pos;
} cfg_daemon;

/* A cost-model profile of the scheduler: the backend ABI's struct, which
 * kernels/sched.h (ks_profile) and the worker use too.  A `devices:` entry's
 * name is owned by the config; a built-in's is the scheduler's table's.
 * Missing keys keep the built-in defaults of the same name where one
 * exists, else 0. */
typedef baton_device_profile cfg_profile;

typedef enum cfg_spawn { CFG_SPAWN_AUTO = 0, CFG_SPAWN_EXTERNAL = 1 } cfg_spawn;

#define CFG_INLINE_US_DEFAULT 50u

typedef struct cfg_worker {
    char *name;
    char *device;          /* "cpu" or "cuda:N" */
    int cuda_index;        /* N of cuda:N, -1 for cpu */
    char *profile;         /* NULL: built-in default for the device */
    uint64_t pool_mb;      /* MiB; default 512 */
    uint32_t streams_compute; /* default 1 */
    uint32_t streams_comm;    /* default 1 */
    uint32_t threads;      /* CPU threads one kernel may use; default 1 */
    uint32_t inline_us;    /* a CPU worker's I/O thread runs a model whose batches take at
                              most this long, µs, itself; 0: never; default 50 */
    cfg_spawn spawn;
    cfg_str key;           /* its own CURVE secret key file, for a spawn: external worker
                            * on a tcp workers_endpoint; s NULL when not given */
    char *host;            /* the host it runs on, as it reports it; NULL: gethostname()
                              (and for spawn: auto, the conductor's own host) */
    char *peer_listen;     /* "tcp://ADDR:PORT" (PORT may be *) its worker-to-worker
                              ROUTER binds; NULL: none (no peer on another host can
                              read its tensors) */
    cfg_pos peer_listen_pos;  /* where peer_listen was read */
    cfg_pos pos;
} cfg_worker;

/* A backend option value, typed by the backend's declaration. */
typedef struct cfg_option {
    char *name;
    bt_opt_type type;
    union {
        int64_t i;
        double f;
        bool b;
        char *s; /* owned, for BT_OPT_STRING and BT_OPT_PATH */
    } v;
    cfg_pos pos;
} cfg_option;

/* How a request picks one replica of a replicated model. */
typedef enum cfg_routing {
    CFG_ROUTE_CACHE_AWARE = 0, /* the replica holding the longest prefix, unless overloaded */
    CFG_ROUTE_LEAST_LOADED = 1,/* the fewest pinned requests per max_batch */
    CFG_ROUTE_ROUND_ROBIN = 2  /* in turn */
} cfg_routing;

/* The longest a step of a tensor-parallel model may run on a rank by
 * default (tp_step_timeout_ms): far above any step of a model a group can
 * hold, far below forever. */
#define CFG_TP_STEP_TIMEOUT_MS 120000u

typedef struct cfg_model {
    char *name;
    char *backend;         /* built-in name or "plugin:/path/lib.so" */
    const bt_backend_desc *desc; /* NULL for plugins (options unchecked) */
    cfg_str *workers;      /* owned array: `worker: x` gives one, `workers: [..]` several */
    size_t n_workers;
    uint32_t tp;           /* tensor-parallel degree; default 1; == n_workers when above 1 */
    uint32_t max_batch;    /* default 1 */
    uint32_t tp_step_timeout_ms; /* tp > 1: the longest a step may run on a rank before the
                                    group is aborted and made again; default 120000 */
    cfg_routing routing;   /* replicas only; default cache_aware */
    cfg_option *options;   /* owned; every declared option, defaults filled in */
    size_t n_options;
    cfg_pos pos;
} cfg_model;

typedef struct cfg_edge {
    char *name;            /* the value's name */
    char *to;              /* a node name, "client", or NULL (declares the value only) */
    char *as;              /* to the client: the name it sees the value by; NULL: name */
    bool persist;
    bool stream;
    bool new_token;
    char *modality;        /* text|image|audio|tensor; default tensor */
    uint32_t shard_dim;    /* default 0 */
    cfg_pos pos;           /* of the edge mapping */
    cfg_pos to_pos;        /* of the `to` value, for "no such node" errors */
} cfg_edge;

typedef enum cfg_section_kind {
    CFG_SEC_NODE = 0,
    CFG_SEC_SEQUENTIAL = 1,
    CFG_SEC_PARALLEL = 2,
    CFG_SEC_LOOP = 3
} cfg_section_kind;

typedef struct cfg_section cfg_section;

typedef struct cfg_node {
    char *name;
    char *model;
    cfg_pos model_pos;
    char *mode;            /* default "" */
    cfg_str *inputs;       /* owned array of value names */
    size_t n_inputs;
    cfg_edge *outputs;     /* owned */
    size_t n_outputs;
    bool consumes_stream;
    bool async;
} cfg_node;

typedef struct cfg_loop {
    char *name;
    uint32_t max_iters;    /* >= 1 */
    cfg_section *body;     /* owned */
    cfg_edge *outputs;     /* owned; edges leaving with the last value */
    size_t n_outputs;
    cfg_edge *accumulate;  /* owned; edges leaving with every value */
    size_t n_accumulate;
} cfg_loop;

struct cfg_section {
    cfg_section_kind kind;
    cfg_pos pos;           /* of the key `node:`, `sequential:`, ... */
    union {
        cfg_node node;
        cfg_loop loop;
        struct {
            cfg_section **items; /* owned array of owned sections */
            size_t n;
        } list;            /* sequential and parallel */
    } u;
};

typedef struct cfg_graph {
    char *name;
    cfg_str *inputs;       /* owned; values the client must send */
    size_t n_inputs;
    cfg_str *optional;     /* owned; inputs a request may leave out (each one of INPUTS) */
    size_t n_optional;
    cfg_section *body;     /* owned */
    cfg_pos pos;
} cfg_graph;

/* A model name served by the OpenAI-compatible HTTP API (`openai:`): which
 * graph answers it, which graph input takes the user's text (a chat) or
 * the uploaded file (audio), which client-bound text stream carries the
 * answer, and which loop max_tokens caps (NULL: none).  API says which
 * endpoints serve it: chat and completions, or the audio transcriptions
 * and translations, whose form fields go as JSON to graph input OPTIONS. */
/* Which endpoints serve an openai model: chat completions with text
 * (chat), the audio transcription and translation endpoints (audio), or
 * chat completions whose user message is audio (voice). */
typedef enum cfg_openai_api {
    CFG_OPENAI_CHAT = 0,
    CFG_OPENAI_AUDIO = 1,
    CFG_OPENAI_VOICE = 2
} cfg_openai_api;

typedef struct cfg_openai {
    char *model;
    char *graph;
    char *input;
    char *output;
    char *loop;
    cfg_openai_api api;
    char *options;         /* api audio, voice: the graph input of the options JSON */
    char *transcript;      /* api voice: the text stream of the transcript */
    char *context;         /* api voice: the optional graph input that takes the earlier
                              turns (system prompt, history) as messages; NULL: none */
    char *segments;        /* api audio: the text stream of segment JSON lines;
                              NULL: verbose_json and subtitles get one span */
    cfg_pos pos;
} cfg_openai;

typedef struct cfg_config {
    char *file;            /* the path it was loaded from */
    uint32_t version;      /* must be 1 */
    cfg_daemon daemon;
    cfg_profile *profiles; size_t n_profiles;
    cfg_worker *workers;   size_t n_workers;
    cfg_model *models;     size_t n_models;
    cfg_graph *graphs;     size_t n_graphs;
    cfg_openai *openai;    size_t n_openai;
} cfg_config;

/* Loads PATH.  On success returns 0 and sets *out.  On errors returns
 * BT_ECONFIG with every error in DIAG and *out NULL (BT_EIO when the file
 * cannot be read, BT_ENOMEM).  Warnings may be added on success. */
int cfg_load_file(const char *path, bt_diag *diag, cfg_config **out);

/* The same from a buffer; NAME is the file name used in messages. */
int cfg_load_string(const char *yaml, size_t len, const char *name, bt_diag *diag,
                    cfg_config **out);

void cfg_config_destroy(cfg_config *c);

const cfg_worker *cfg_worker_find(const cfg_config *c, const char *name);
const cfg_model *cfg_model_find(const cfg_config *c, const char *name);
const cfg_option *cfg_model_option(const cfg_model *m, const char *name);
/* True when M holds a full copy on each of several workers (no tp): a
 * request then runs on one replica. */
bool cfg_model_replicated(const cfg_model *m);
/* "cache_aware", "least_loaded" or "round_robin"; NULL past the last. */
const char *cfg_routing_name(cfg_routing r);

/* The profile called NAME: the config's `devices:` entry, else the
 * built-in one (h100, h200, cpu), else NULL. */
const cfg_profile *cfg_profile_find(const cfg_config *c, const char *name);

/* The cost-model profile of W: its `profile`, else the built-in default for
 * its device (h100 for cuda:N, cpu for cpu).  Never NULL for a loaded
 * config. */
const cfg_profile *cfg_worker_profile(const cfg_config *c, const cfg_worker *w);

/* Adds to DIAG a warning for each runtime path that does not exist now:
 * a PATH option of a model (relative paths are taken from the current
 * directory), a plugin library named with a slash, and the folder of an
 * ipc:// endpoint.  These are warnings, not errors: --check-config may run
 * on a machine other than the one that serves.  Returns the number of
 * warnings added. */
int cfg_check_paths(const cfg_config *c, bt_diag *diag);

/* Whether the endpoint is tcp:// on a loopback host (127.0.0.0/8, ::1,
 * localhost). */
bool cfg_endpoint_is_tcp(const char *endpoint);
bool cfg_endpoint_is_loopback(const char *endpoint);

/* Reads and checks the CURVE key files of daemon.curve that one process
 * needs, adding an error at the key's line for each that is missing,
 * unreadable, not a Z85 key, a secret key readable by group or others, or
 * a .pub that does not match its secret key.  WORKER NULL: batond's view
 * (secret_key, public_key, client_keys, worker_keys).  WORKER a name: that
 * worker's view (its `key:` and batond's public key: public_key, else the
 * .pub twin of secret_key, else secret_key itself).  The files live on
 * different hosts, so cfg_load does not read them: batond calls this at
 * start, on SIGHUP and in --check-config, a worker at start.  Returns the
 * number of errors added. */
int cfg_check_keys(const cfg_config *c, const char *worker, bt_diag *diag);

/* Batond's public key for a worker (the resolution of cfg_check_keys's
 * worker view) into OUT (41 bytes).  0, or a negative bt_curve_err with a
 * sentence in ERR. */
int cfg_server_public_key(const cfg_config *c, char *out, char *err, size_t errlen);

#endif
