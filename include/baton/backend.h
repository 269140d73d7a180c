/* baton backend ABI, version 4.
 *
 * A backend runs the nodes of one kind of model on a worker.  The built-in
 * backends (echo, add, counter, chunks, sleep, fail; later transformer) and
 * plugins use this very header: a plugin is a shared library that exports
 *
 *     const baton_backend *baton_backend_entry(void);
 *
 * and is named in the config as `backend: plugin:/path/libx.so`.  The worker
 * checks `abi_version` before calling anything else, so a plugin built
 * against another version is refused with a message rather than crashing.
 *
 * The shape follows ggml's backends: opaque handles (baton_model,
 * baton_session) that the backend defines, and a struct of function pointers
 * (baton_backend) whose slots are each commented; optional slots may be NULL.
 * The worker hands the backend a baton_ctx, a second table of function
 * pointers through which it allocates tensors in the worker's pool, names
 * its outputs, emits stream chunks, raises the finish signal and reports
 * errors.  The backend never talks to the conductor and never frees a
 * tensor: the worker owns every byte of the pool.
 *
 * Threading: the worker never calls execute(), session_open() or
 * session_close() of one model from two threads at once, so a backend needs
 * no locks for per-model state.  Different models may run at the same time
 * on different threads (the worker's compute streams).
 *
 * Status codes are the numbers of proto enum Code (gRPC's), so that a
 * backend error reaches the client unchanged. */
#ifndef BATON_BACKEND_H
#define BATON_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version 2 added the device profile and stream counts to
 * baton_load_params and the model_describe slot.  Version 3 added GPU
 * workers: tensor data may be device memory, so baton_ctx gained read,
 * write, device and stream.  Version 4 added conversations
 * (baton_input.chat) and token counts (baton_ctx.count_tokens).  Version 5
 * added raw text (baton_input.raw).  Version 6 added baton_ctx.defer.
 * Version 7 added prefix caches: baton_ctx.count_cached and the
 * cache_report slot.  Version 8 added baton_load_params.cancelled,
 * cancel_arg and group_ms (a model_load that waits for its tensor-parallel
 * group gives up when the worker stops or the group does not form in
 * time), and the model_abort and model_broken slots (a step stuck in a
 * collective ends; a step whose group failed sends nothing). */
#define BATON_BACKEND_ABI_VERSION 8u

/* The symbol every plugin exports. */
#define BATON_BACKEND_ENTRY_SYMBOL "baton_backend_entry"

/* Most dimensions a tensor may have. */
#define BATON_MAX_DIMS 8

/* Element types; the numbers equal proto enum DType. */
typedef enum baton_dtype {
    BATON_DTYPE_INVALID = 0,
    BATON_DTYPE_F32 = 1,
    BATON_DTYPE_F16 = 2,
    BATON_DTYPE_BF16 = 3,
    BATON_DTYPE_I32 = 4,
    BATON_DTYPE_I64 = 5,
    BATON_DTYPE_U8 = 6,
    BATON_DTYPE_BOOL = 7
} baton_dtype;

/* Status codes; the numbers equal proto enum Code. */
typedef enum baton_status {
    BATON_STATUS_OK = 0,
    BATON_STATUS_CANCELLED = 1,
    BATON_STATUS_UNKNOWN = 2,
    BATON_STATUS_INVALID_ARGUMENT = 3,
    BATON_STATUS_DEADLINE_EXCEEDED = 4,
    BATON_STATUS_NOT_FOUND = 5,
    BATON_STATUS_ALREADY_EXISTS = 6,
    BATON_STATUS_RESOURCE_EXHAUSTED = 8,
    BATON_STATUS_FAILED_PRECONDITION = 9,
    BATON_STATUS_INTERNAL = 13,
    BATON_STATUS_UNAVAILABLE = 14
} baton_status;

/* Bytes per element of DTYPE; 0 for an invalid one. */
static inline size_t baton_dtype_size(baton_dtype dtype)
{
    switch (dtype) {
    case BATON_DTYPE_F32: case BATON_DTYPE_I32: return 4;
    case BATON_DTYPE_F16: case BATON_DTYPE_BF16: return 2;
    case BATON_DTYPE_I64: return 8;
    case BATON_DTYPE_U8: case BATON_DTYPE_BOOL: return 1;
    case BATON_DTYPE_INVALID: break;
    }
    return 0;
}

/* Defined by each backend. */
typedef struct baton_model baton_model;     /* a loaded model (weights, compiled graphs) */
typedef struct baton_session baton_session; /* per-request state, e.g. a KV cache */

/* A dense tensor in the worker's pool (or, for inputs, in a peer's pool
 * mapped into this process), contiguous and row-major.
 *
 * Where `data` points depends on the worker's device (baton_ctx.device):
 * on "cpu" it is host memory the backend reads and writes directly; on
 * "cuda:N" it is device memory of that GPU, which only kernels and CUDA
 * copies may touch (ctx->read and ctx->write do the copies for a backend
 * that wants the bytes on the host). */
typedef struct baton_tensor {
    baton_dtype dtype;
    uint32_t ndim;                  /* 0: a scalar (one element) */
    int64_t dims[BATON_MAX_DIMS];   /* outermost first; dims[k] >= 0 */
    void *data;                     /* element 0; inputs are read-only; never NULL */
    uint64_t nbytes;                /* product(dims) * baton_dtype_size(dtype) */
    uint64_t handle;                /* the worker's; a backend must not change it */
} baton_tensor;

/* One input of an item: the value the conductor sent, already joined. */
typedef struct baton_input {
    const char *name;               /* the node's input name */
    baton_tensor tensor;
    int stream;                     /* 1: this is the node's stream input */
    int final;                      /* stream input: its final chunk is among these */
    int chat;                       /* 1: TENSOR is a conversation (a request's messages),
                                     * U8 bytes read with baton_chat_next; a backend that
                                     * takes text but no conversations should refuse it */
    int raw;                        /* 1: TENSOR is text for the model as it is: a backend
                                     * that wraps text prompts in a chat template must not
                                     * (the request's raw_inputs; a completion, not a chat) */
} baton_input;

/* One turn of a conversation input. */
typedef struct baton_chat_turn {
    const char *role;               /* "system", "user" or "assistant"; not NUL-terminated */
    uint32_t role_len;
    const char *content;            /* UTF-8, not NUL-terminated */
    uint32_t content_len;
} baton_chat_turn;

/* The turn at *AT of the conversation DATA[0, LEN): the bytes hold, per turn,
 * the role's length (u32, little-endian), the role, the content's length
 * (u32, little-endian) and the content.  Advances *AT; returns 1 for a
 * turn, 0 at the end, -1 when the bytes are malformed (the conductor writes
 * only well-formed ones). */
static inline int baton_chat_next(const uint8_t *data, uint64_t len, uint64_t *at,
                                  baton_chat_turn *turn)
{
    uint32_t n[2];
    const uint8_t *p[2];
    if (*at == len)
        return 0;
    for (int k = 0; k < 2; k++) {
        if (len - *at < 4)
            return -1;
        n[k] = (uint32_t)data[*at] | (uint32_t)data[*at + 1] << 8 |
               (uint32_t)data[*at + 2] << 16 | (uint32_t)data[*at + 3] << 24;
        *at += 4;
        if (len - *at < n[k])
            return -1;
        p[k] = data + *at;
        *at += n[k];
    }
    turn->role = (const char *)p[0], turn->role_len = n[0];
    turn->content = (const char *)p[1], turn->content_len = n[1];
    return 1;
}

/* One output an item must produce. */
typedef struct baton_output {
    const char *name;               /* output value name */
    int stream;                     /* 1: emitted as chunks (emit_chunk) */
    int client;                     /* 1: client-bound (informational) */
} baton_output;

/* The request's sampling parameters (proto Sampling). */
typedef struct baton_sampling {
    float temperature;              /* 0: greedy */
    uint32_t top_k;                 /* 0: no cut */
    float top_p;                    /* 0 or 1: no cut */
    uint64_t seed;                  /* per-request seed */
} baton_sampling;

/* One (request, node, iteration) to run.  The worker fills every field
 * before execute(); the backend reports through the ctx callbacks only. */
typedef struct baton_item {
    uint64_t request_key;           /* the conductor's key of the request */
    const char *request_id;         /* the client's id (logs) */
    const char *node_name;          /* node name (error messages) */
    const char *mode;               /* the node's mode string ("" when unset) */
    uint32_t graph, node;           /* indices (tracing) */
    const uint32_t *iteration;      /* iteration vector, outermost first */
    uint32_t depth;                 /* its length; 0 outside loops */
    const baton_input *inputs;      /* in the node's input order */
    uint32_t n_inputs;
    const baton_output *outputs;    /* in the node's output order */
    uint32_t n_outputs;
    baton_session *session;         /* from session_open; NULL when the backend has none */
    baton_sampling sampling;
} baton_item;

/* Innermost loop iteration of ITEM (0 outside loops). */
static inline uint32_t baton_item_iteration(const baton_item *item)
{
    return item->depth ? item->iteration[item->depth - 1] : 0;
}

/* What the worker offers a backend during execute().  Every callback takes
 * the ctx it came in and one of the items of the current call. */
typedef struct baton_ctx baton_ctx;
struct baton_ctx {
    /* Allocates a tensor in the worker's pool.  It belongs to ITEM until it
     * is handed out with set_output or emit_chunk; one never handed out is
     * freed after execute() returns.  Returns NULL when the pool is full (the
     * item is then failed with RESOURCE_EXHAUSTED unless the backend fails
     * it otherwise) or the shape is invalid. */
    baton_tensor *(*alloc)(baton_ctx *ctx, baton_item *item, baton_dtype dtype, uint32_t ndim,
                           const int64_t *dims);

    /* Makes TENSOR the value of non-stream output OUTPUT of ITEM.  TENSOR is
     * one from alloc, or an input's tensor (&item->inputs[k].tensor): then
     * the output *is* the input, passed by reference without a copy.  On a
     * stream output it emits TENSOR as one final chunk.  Setting an output
     * twice replaces the first value.  Returns 0 or -1 (bad index or
     * tensor). */
    int (*set_output)(baton_ctx *ctx, baton_item *item, uint32_t output,
                      const baton_tensor *tensor);

    /* Shorthand for set_output(ctx, item, output, &item->inputs[input].tensor):
     * the pass-through of echo. */
    int (*forward)(baton_ctx *ctx, baton_item *item, uint32_t output, uint32_t input);

    /* Emits TENSOR (from alloc, or an input's) as the next chunk of stream
     * output OUTPUT; it is sent to the conductor at once.  FINAL marks the
     * last chunk; TENSOR may be NULL only with FINAL (close the stream
     * without another chunk).  A stream output that was not closed when
     * execute() returns is closed by the worker with an empty final chunk.
     * Returns 0 or -1 (bad index, output not a stream, already closed). */
    int (*emit_chunk)(baton_ctx *ctx, baton_item *item, uint32_t output,
                      const baton_tensor *tensor, int final);

    /* Raises the finish signal: ITEM's innermost loop ends after this
     * iteration (e.g. the model produced EOS). */
    void (*finish)(baton_ctx *ctx, baton_item *item);

    /* Fails ITEM with CODE (not OK) and MESSAGE (copied).  Its outputs are
     * discarded; chunks already emitted stay emitted. */
    void (*fail)(baton_ctx *ctx, baton_item *item, baton_status code, const char *message);

    /* Nonzero once ITEM no longer needs an answer: its request was closed or
     * its iteration dropped (BATON_STATUS_CANCELLED), or its deadline passed
     * (BATON_STATUS_DEADLINE_EXCEEDED).  A long execution polls it. */
    baton_status (*cancelled)(baton_ctx *ctx, const baton_item *item);

    /* Sleeps up to MS milliseconds, returning early when ITEM is cancelled
     * or reaches its deadline.  Returns what cancelled() returns at the
     * end: BATON_STATUS_OK when the full time passed. */
    baton_status (*sleep_ms)(baton_ctx *ctx, const baton_item *item, uint32_t ms);

    /* Copies N bytes from byte OFFSET of TENSOR (an input's, or one from
     * alloc) into host memory DST, whatever memory the tensor lives in.
     * Returns 0, or -1 on a bad tensor or range or a failed device copy
     * (the item is then failed with a message). */
    int (*read)(baton_ctx *ctx, baton_item *item, const baton_tensor *tensor, uint64_t offset,
                void *dst, uint64_t n);

    /* Copies N bytes of host memory SRC to byte OFFSET of TENSOR, which must
     * come from alloc (inputs are read-only).  Returns 0 or -1 as read. */
    int (*write)(baton_ctx *ctx, baton_item *item, baton_tensor *tensor, uint64_t offset,
                 const void *src, uint64_t n);

    /* Counts tokens for ITEM's request: PROMPT tokens read (a prefill's
     * prompt) and GENERATED tokens produced (one per sampled token).  The
     * counts add up over calls and over the request's items, and come back
     * to the client as the response's usage; a backend without tokens never
     * calls it. */
    void (*count_tokens)(baton_ctx *ctx, baton_item *item, uint32_t prompt, uint32_t generated);

    /* Puts ITEM back in the worker's queue instead of running it now: the
     * backend lacks something only another item's end can give back (a
     * decoding slot, say).  The item must have no output set and no chunk
     * emitted.  The worker offers it again in a later execute(), once an
     * item of the model has ended or a session of it has closed, and only
     * in a batch with a place no ready item takes; it waits as any queued
     * item does (its request's deadline, a cancel).  A model split over a
     * tensor-parallel group cannot defer: the item fails
     * RESOURCE_EXHAUSTED. */
    void (*defer)(baton_ctx *ctx, baton_item *item);

    /* Counts CACHED of ITEM's prompt tokens as read from a prefix cache
     * instead of computed (they are among the prompt tokens count_tokens
     * counts).  They add up as count_tokens' do, and come back to the
     * client as the response's usage.cached_tokens. */
    void (*count_cached)(baton_ctx *ctx, baton_item *item, uint32_t cached);

    uint32_t threads;               /* CPU threads one kernel may use (worker `threads`) */
    const char *device;             /* where tensor data lives: "cpu" or "cuda:N" */
    /* On "cuda:N": the cudaStream_t of this call's lane.  Work a backend
     * queues on it counts as part of execute(): the worker synchronizes it
     * before it reports an output or a chunk, so an edge never points at
     * unwritten memory.  A backend with streams of its own synchronizes
     * them before it returns or emits.  NULL on "cpu". */
    void *stream;
    void *impl;                     /* the worker's; a backend must not touch it */
};

/* The cost-model profile of the worker's device: the config's `devices:`
 * entry the worker names, else the built-in default for its device.  A
 * backend that schedules ops across streams costs
 * them with it. */
typedef struct baton_device_profile {
    const char *name;               /* "cpu", "h100", or the config's name */
    double memory_bandwidth_gbps;   /* GB/s */
    double memory_efficiency;       /* 0..1 */
    double tflops;                  /* dense peak, TFLOP/s */
    double comm_bandwidth_gbps;     /* GB/s per link */
    double comm_efficiency;         /* 0..1 */
    double sync_overhead_us;        /* cost of a cross-stream event, us */
} baton_device_profile;

/* What model_load gets. */
typedef struct baton_load_params {
    const char *model;              /* the model's config name */
    const char *const *keys;        /* options, values as text (config `options:`) */
    const char *const *values;
    size_t n_options;
    uint32_t tp_rank, tp_size;      /* tensor-parallel rank and group size (1: not sharded) */
    const char *device;             /* "cpu", "cuda:0" */
    uint32_t max_batch;             /* most items one execute() gets (>= 1) */
    uint32_t threads;               /* CPU threads one kernel may use */
    const baton_device_profile *profile; /* NULL: the built-in default for `device`;
                                       valid during model_load only */
    uint32_t compute_streams;       /* the worker's `streams.compute` (>= 1) */
    uint32_t comm_streams;          /* its `streams.comm` (0 or 1) */
    /* tp_size > 1: the group's communicator id (an NCCL unique id), made by
     * rank 0 and handed to every rank; NULL otherwise.  Every rank's
     * model_load joins the group with it, so the ranks load together. */
    const void *comm_id;
    size_t comm_id_len;
    /* A model_load that waits on others (a tensor-parallel group forming:
     * every rank must join before any returns) polls cancelled(cancel_arg)
     * and gives up when it returns nonzero (the worker is stopping: the
     * group broke, or batond stops), or once group_ms milliseconds have
     * passed (0: no limit).  A rank that never joins would otherwise keep
     * the others waiting until they are killed.  cancelled may be NULL.
     * A load that fails because its group did not form returns
     * BATON_STATUS_UNAVAILABLE (the rank is then restarted and tries
     * again); any other failure is taken as the rank's own, and its group
     * waits for that worker to register again. */
    int (*cancelled)(void *cancel_arg);
    void *cancel_arg;
    uint32_t group_ms;
} baton_load_params;

/* Value of option KEY in P, or NULL. */
static inline const char *baton_load_option(const baton_load_params *p, const char *key)
{
    for (size_t i = 0; i < p->n_options; i++) {
        const char *a = p->keys[i], *b = key;
        while (*a && *a == *b)
            a++, b++;
        if (*a == *b)
            return p->values[i];
    }
    return 0;
}

/* What a model's prefix cache did (cache_report): counters since the load,
 * and the routing keys of cached prompts that came and went since the last
 * report.  A routing key is the chained hashes of a prompt's first input's
 * bytes in blocks of 64 (common/prefix.h's bt_prefix_hashes); the
 * conductor computes the same for a new request and routes it to the
 * replica that reported the longest match. */
typedef struct baton_cache_report {
    uint64_t hits, misses;          /* prompts that reused a cached prefix, that did not */
    uint64_t hit_tokens;            /* prompt tokens read from the cache */
    uint64_t evictions;             /* cached prefixes dropped for room */
    uint64_t cached_bytes;          /* bytes of KV the cache holds now */
    uint64_t entries;               /* cached prefixes now */
    const uint64_t *stored;         /* routing keys now held: valid until the next call */
    size_t n_stored;
    const uint64_t *removed;        /* routing keys no longer held */
    size_t n_removed;
} baton_cache_report;

/* A backend: one per kind of model; the worker loads models through it. */
typedef struct baton_backend {
    /* BATON_BACKEND_ABI_VERSION of the header the backend was built with. */
    uint32_t abi_version;

    /* Short name for logs ("echo", "mylib"). */
    const char *name;

    /* Required.  Loads a model: reads options, loads weights, compiles.
     * Returns BATON_STATUS_OK and sets *out, or an error code with a
     * message in ERR (NUL-terminated, at most ERRLEN bytes; a message that
     * does not fit is cut). */
    baton_status (*model_load)(const baton_load_params *params, baton_model **out, char *err,
                               size_t errlen);

    /* Required.  Frees a model; every session of it was closed before. */
    void (*model_unload)(baton_model *model);

    /* Optional: bytes of weights the model holds (Loaded.weight_bytes).
     * NULL: 0. */
    uint64_t (*model_bytes)(const baton_model *model);

    /* Optional: opens per-request state.  Called before the first execute()
     * of a request on the model; *out may be set to NULL.  NULL slot:
     * items carry no session.  An error fails the item with its code. */
    baton_status (*session_open)(baton_model *model, uint64_t request_key, baton_session **out,
                                 char *err, size_t errlen);

    /* Optional: frees a session when its request ends (SessionClose).  Never
     * called while an execute() of the model runs. */
    void (*session_close)(baton_model *model, baton_session *session);

    /* Required.  Runs N items of one (model, mode), N <= max_batch.  Every
     * item must end with its outputs set, or failed.  An item whose
     * non-stream outputs are left unset completes without them (the
     * conductor treats a missing needed output as an error). */
    void (*execute)(baton_model *model, baton_ctx *ctx, baton_item *const *items, size_t n);

    /* Optional: a human-readable account of what the load built (for a
     * compiled model: each executable's schedule decision and predicted
     * makespans, its streams, its arena against the peak-live bound).  The
     * worker logs it and the conductor shows it in `batonctl inspect`.
     * Writes at most LEN bytes (NUL-terminated) and returns the length the
     * whole text needs, as snprintf does.  NULL: nothing to report. */
    int (*model_describe)(const baton_model *model, char *buf, size_t len);

    /* Optional: the model's prefix cache, into *OUT.  Called on the thread
     * that runs the model, after each execute() and after session closes;
     * returns 1 when something changed since the last call (the worker then
     * reports it to the conductor), 0 when nothing did or the model keeps
     * no prefix cache.  NULL: none. */
    int (*cache_report)(baton_model *model, baton_cache_report *out);

    /* Optional (a backend whose models join tensor-parallel groups): called
     * from another thread while an execute() of MODEL may wait in a
     * collective that will never complete, a rank of its group being stuck
     * (the step outlived Load.tp_step_ms).  Aborts what the other ranks
     * wait on with it (the group's communicator: ncclCommAbort), so that
     * their collectives end too.  Must not block.  The worker process
     * exits right after, without waiting for the execute() or unloading:
     * the group is made again.  NULL: the worker just exits. */
    void (*model_abort)(baton_model *model);

    /* Optional (the same backends): called after each execute() of a model
     * loaded with tp_size > 1; nonzero when its group failed during it (a
     * rank aborted the communicator, or NCCL lost one): its collectives may
     * have ended early, so its outputs are undefined.  The worker then
     * exits without sending them, and the group is made again.  NULL:
     * never. */
    int (*model_broken)(baton_model *model);
} baton_backend;

/* The entry point of a plugin. */
typedef const baton_backend *(*baton_backend_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif
