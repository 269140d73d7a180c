/* cudaemu runtime: errors, devices, streams, events, stream capture and
 * graphs, copies and memsets.
 *
 * Streams are in-order queues of commands.  Nothing runs when it is
 * queued: device work runs when the host waits for it (a synchronous copy,
 * cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize) or
 * polls (a query runs one command).  Then the ready heads of all streams
 * run one at a time in an order drawn from CUDAEMU_SEED, until what the
 * host waits for is done.  So two streams with no event between them run
 * in a different order under different seeds, as they would overlap on a
 * GPU, and a missing cudaStreamWaitEvent shows as a wrong result.
 *
 * The legacy default stream (NULL) keeps CUDA's implicit synchronisation:
 * its work waits for all earlier work of blocking streams, and theirs waits
 * for its.  Streams created cudaStreamNonBlocking do neither.
 *
 * A capturing stream records commands into a graph instead of queueing
 * them; another stream joins the capture by waiting on an event recorded
 * in it.  A call that is unsafe during a capture (cudaMalloc, a
 * synchronous copy, a device-wide sync) invalidates it and fails, as it
 * does on a GPU, so code that creates a cuBLAS handle or allocates inside a
 * capture fails here as it would there. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <set>
#include <thread>
#include <vector>

#include "cudaemu/emu.h"

namespace cudaemu {

emu_mutex emu_lock;

void emu_mutex::lock()
{
    std::thread::id me = std::this_thread::get_id();
    if (owner_.load(std::memory_order_relaxed) == me) {
        depth_++;
        return;
    }
    waiting_++;
    m_.lock();
    waiting_--;
    owner_.store(me, std::memory_order_relaxed);
    depth_ = 1;
}

void emu_mutex::unlock()
{
    if (--depth_ > 0)
        return;
    owner_.store(std::thread::id(), std::memory_order_relaxed);
    m_.unlock();
}

unsigned emu_mutex::release_all()
{
    unsigned d = depth_;
    depth_ = 0;
    owner_.store(std::thread::id(), std::memory_order_relaxed);
    m_.unlock();
    return d;
}

void emu_mutex::reacquire(unsigned depth)
{
    waiting_++;
    m_.lock();
    waiting_--;
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    depth_ = depth;
}

void emu_mutex::yield_to_waiters()
{
    int before = waiting_.load(std::memory_order_relaxed);
    unsigned d = release_all();
    /* std::mutex is not fair: without a pause the releasing thread would
     * often take it straight back.  Give the waiters a moment to get in
     * (each that does leaves the count). */
    for (int i = 0; i < 200 && waiting_.load(std::memory_order_relaxed) >= before; i++)
        std::this_thread::yield();
    reacquire(d);
}

/* ---- reports, errors, the seeded order ------------------------------------------ */

static unsigned long n_problems;
static std::set<std::string> problems_seen;

void problem(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    n_problems++;
    if (problems_seen.insert(buf).second)
        fprintf(stderr, "cudaemu: problem: %s\n", buf);
}

static uint64_t rng_state;

static void seed_from(uint64_t seed)
{
    rng_state = (seed ? seed : 1) * 0x9e3779b97f4a7c15ull;
}

uint64_t rng(void)
{
    if (!rng_state) {
        const char *s = getenv("CUDAEMU_SEED");
        seed_from(s ? strtoull(s, NULL, 0) : 1);
    }
    /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static thread_local cudaError_t last_error = cudaSuccess;
static cudaError_t sticky = cudaSuccess;

cudaError_t set_error(cudaError_t e)
{
    if (e != cudaSuccess && last_error == cudaSuccess)
        last_error = e;
    return e;
}

cudaError_t set_sticky(cudaError_t e)
{
    if (sticky == cudaSuccess)
        sticky = e;
    return set_error(e);
}

cudaError_t sticky_error(void)
{
    return sticky;
}

/* ---- streams and events ---------------------------------------------------------- */

struct capture;

struct dep {
    struct ::cudaemu_stream *s;
    uint64_t seq;
};

struct command {
    uint64_t seq; /* 1, 2, ... within its stream */
    const char *what;
    std::function<void()> fn;          /* runs once; or */
    std::function<poll_result()> poll; /* polled until POLL_DONE */
    std::vector<dep> deps;
    bool self_open; /* FN opens the device memory it touches itself (a copy) */
    bool running;   /* a thread runs FN now (it may let the lock go meanwhile) */
};

struct gnode {
    const char *what;
    std::function<void()> fn;
    std::vector<int> deps; /* indices of earlier nodes */
};

struct capture {
    cudaStreamCaptureMode mode;
    std::thread::id owner;
    struct ::cudaemu_stream *origin;
    bool invalid;
    const char *why; /* the call that invalidated it */
    std::vector<gnode> nodes;
};

} /* namespace cudaemu */

struct cudaemu_stream {
    unsigned flags;
    bool legacy;
    bool destroyed;
    uint64_t enq;  /* seq of the last command queued */
    uint64_t done; /* seq of the last command run */
    std::deque<cudaemu::command> q;
    cudaemu::capture *cap;  /* the capture it takes part in, or NULL */
    std::vector<int> tail;  /* its last nodes in that capture */
};

struct cudaemu_event {
    unsigned flags;
    bool recorded;
    cudaemu_stream *s;
    uint64_t seq;
    cudaemu::capture *cap; /* recorded inside a capture: the nodes it follows */
    std::vector<int> nodes;
};

struct cudaemu_graph {
    std::vector<cudaemu::gnode> nodes;
};

struct cudaemu_graph_exec {
    /* Shared with launches still queued, so destroying it needs no sync. */
    std::shared_ptr<const std::vector<cudaemu::gnode>> nodes;
};

namespace cudaemu {

static cudaemu_stream legacy_stream = {0, true, false, 0, 0, {}, NULL, {}};
/* Every stream made, the destroyed included: an event may still name one
 * (their structs are small; a worker makes a handful). */
static std::vector<std::unique_ptr<cudaemu_stream>> streams;
static std::vector<capture *> captures;

static cudaemu_stream *S(cudaStream_t s)
{
    return !s || s == cudaStreamLegacy ? &legacy_stream : s;
}

static bool dep_met(const dep &d)
{
    return d.s->done >= d.seq;
}

static bool head_ready(const cudaemu_stream *s)
{
    if (s->q.empty() || s->q.front().running)
        return false;
    for (const dep &d : s->q.front().deps)
        if (!dep_met(d))
            return false;
    return true;
}

/* Runs the head of S; false when it is a polled command still waiting.
 * Device memory is opened whole (*OPENED set) before the first command
 * that needs it: a copy opens only its own allocations. */
static bool run_head(cudaemu_stream *s, bool *opened)
{
    command &h = s->q.front();
    if (!h.self_open && !*opened) {
        mem_open();
        *opened = true;
    }
    if (!sticky && h.poll && h.poll() == POLL_WAIT)
        return false;
    if (!sticky && h.fn) {
        h.running = true;
        h.fn();
        h.running = false;
    }
    s->done = h.seq;
    s->q.pop_front();
    return true;
}

double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

double wait_limit_s(void)
{
    const char *s = getenv("CUDAEMU_NCCL_TIMEOUT");
    return s && atof(s) > 0 ? atof(s) : 60.0;
}

/* Lets the other threads in while this one waits for another process:
 * device memory this thread opened (*OPENED) is closed first, since none
 * may be open while the lock is free, and opened again by the next command
 * that needs it. */
static void wait_for_peer(bool *opened)
{
    if (*opened) {
        mem_close();
        *opened = false;
    }
    unsigned depth = emu_lock.release_all();
    usleep(50);
    emu_lock.reacquire(depth);
}

/* Runs ready stream heads, in seeded order, until DONE holds (or MAX_STEPS
 * commands ran).  When every ready head waits for another process, lets
 * the lock go a little and polls again; between two commands, it lets in a
 * thread that asks for the lock.  False (and a problem) when nothing can
 * run any more, which needs an event that is never recorded (impossible
 * through this API, so a bug here), or when a wait outlasts the limit. */
static bool drain(const std::function<bool()> &done, int max_steps = -1)
{
    std::vector<cudaemu_stream *> ready;
    bool opened = false;
    bool ok = true;
    double waiting_since = 0;
    while (!done() && max_steps != 0) {
        ready.clear();
        if (head_ready(&legacy_stream))
            ready.push_back(&legacy_stream);
        for (auto &s : streams)
            if (head_ready(s.get()))
                ready.push_back(s.get());
        if (ready.empty()) {
            problem("device work waits for itself (no stream can run)");
            ok = false;
            break;
        }
        /* Heads in seeded order; the first that completes counts. */
        size_t first = rng() % ready.size();
        bool ran = false;
        for (size_t i = 0; i < ready.size() && !ran; i++)
            ran = run_head(ready[(first + i) % ready.size()], &opened);
        if (ran) {
            waiting_since = 0;
            if (max_steps > 0)
                max_steps--;
            if (emu_lock.contended()) {
                if (opened) {
                    mem_close();
                    opened = false;
                }
                emu_lock.yield_to_waiters();
            }
            continue;
        }
        double now = seconds_now();
        if (!waiting_since)
            waiting_since = now;
        if (now - waiting_since > wait_limit_s()) {
            problem("%s has waited %.0f s for another process (a peer rank that never joined "
                    "the collective?)", ready[first]->q.front().what, now - waiting_since);
            ok = false;
            break;
        }
        if (max_steps > 0) /* a query: report not ready rather than sleep */
            break;
        wait_for_peer(&opened);
    }
    if (opened)
        mem_close();
    return ok;
}

static bool stream_idle(const cudaemu_stream *s)
{
    return s->done == s->enq;
}

static bool all_idle(void)
{
    if (!stream_idle(&legacy_stream))
        return false;
    for (auto &s : streams)
        if (!stream_idle(s.get()))
            return false;
    return true;
}

static void capture_invalidate(capture *c, const char *why)
{
    if (!c->invalid) {
        c->invalid = true;
        c->why = why;
    }
}

cudaError_t capture_check_unsafe(const char *api)
{
    cudaError_t e = cudaSuccess;
    for (capture *c : captures) {
        if (c->mode == cudaStreamCaptureModeRelaxed)
            continue;
        if (c->mode == cudaStreamCaptureModeThreadLocal && c->owner != std::this_thread::get_id())
            continue;
        capture_invalidate(c, api);
        e = cudaErrorStreamCaptureUnsupported;
    }
    return e ? set_error(e) : e;
}

static cudaError_t enqueue(cudaStream_t stream, const char *what, std::function<void()> fn,
                           std::function<poll_result()> poll, bool self_open = false)
{
    cudaemu_stream *s = S(stream);
    if (s->destroyed)
        return set_error(cudaErrorInvalidResourceHandle);
    if (s->cap) {
        capture *c = s->cap;
        if (c->invalid)
            return set_error(cudaErrorStreamCaptureInvalidated);
        if (poll) /* in a graph a polled command runs to completion */
            fn = [poll] {
                double t0 = seconds_now();
                while (poll() == POLL_WAIT) {
                    if (seconds_now() - t0 > wait_limit_s()) {
                        problem("a collective in a graph waited too long for another process");
                        set_sticky(cudaErrorLaunchFailure);
                        return;
                    }
                    /* The graph's command is marked running, so no other
                     * thread runs it meanwhile; the memory the drain
                     * opened for it is opened again after. */
                    bool opened = true;
                    wait_for_peer(&opened);
                    mem_open();
                }
            };
        gnode n = {what, std::move(fn), s->tail};
        c->nodes.push_back(std::move(n));
        s->tail.assign(1, (int)c->nodes.size() - 1);
        return cudaSuccess;
    }
    command c = {++s->enq, what, std::move(fn), std::move(poll), {}, self_open, false};
    if (s->legacy) {
        for (auto &o : streams)
            if (!o->destroyed && !(o->flags & cudaStreamNonBlocking)) {
                if (o->cap) {
                    /* An implicit dependency on a capturing stream. */
                    capture_invalidate(o->cap, "work on the legacy default stream");
                    s->enq--;
                    return set_error(cudaErrorStreamCaptureImplicit);
                }
                c.deps.push_back({o.get(), o->enq});
            }
    } else if (!(s->flags & cudaStreamNonBlocking)) {
        c.deps.push_back({&legacy_stream, legacy_stream.enq});
    }
    s->q.push_back(std::move(c));
    return cudaSuccess;
}

cudaError_t stream_enqueue(cudaStream_t stream, const char *what, std::function<void()> fn)
{
    return enqueue(stream, what, std::move(fn), nullptr);
}

cudaError_t stream_enqueue_polled(cudaStream_t stream, const char *what,
                                  std::function<poll_result()> poll)
{
    return enqueue(stream, what, nullptr, std::move(poll));
}

/* Runs device work until DONE holds (or a launch failed): the host side
 * of every synchronising call. */
static cudaError_t wait_for(const std::function<bool()> &done)
{
    if (!drain([&done] { return done() || sticky; }))
        return set_sticky(cudaErrorLaunchFailure);
    return sticky ? set_error(sticky) : cudaSuccess;
}

static cudaError_t sync_stream(cudaemu_stream *s)
{
    return wait_for([s] { return stream_idle(s); });
}

} /* namespace cudaemu */

using namespace cudaemu;

#define LOCK() std::lock_guard<emu_mutex> lock_(emu_lock)
#define STICKY()                      \
    do {                              \
        if (sticky)                   \
            return set_error(sticky); \
    } while (0)

extern "C" {

/* ---- errors and devices ------------------------------------------------------------- */

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
#define N(x) \
    case x: return #x;
        N(cudaSuccess) N(cudaErrorInvalidValue) N(cudaErrorMemoryAllocation)
        N(cudaErrorInitializationError) N(cudaErrorInvalidConfiguration)
        N(cudaErrorInvalidDevicePointer) N(cudaErrorInvalidMemcpyDirection)
        N(cudaErrorNoDevice) N(cudaErrorInvalidDevice) N(cudaErrorDeviceUninitialized)
        N(cudaErrorInvalidResourceHandle) N(cudaErrorIllegalState) N(cudaErrorNotReady)
        N(cudaErrorIllegalAddress) N(cudaErrorLaunchOutOfResources) N(cudaErrorLaunchFailure)
        N(cudaErrorNotSupported) N(cudaErrorStreamCaptureUnsupported)
        N(cudaErrorStreamCaptureInvalidated) N(cudaErrorStreamCaptureUnjoined)
        N(cudaErrorStreamCaptureImplicit) N(cudaErrorStreamCaptureWrongThread)
        N(cudaErrorUnknown)
#undef N
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorDeviceUninitialized: return "invalid device context";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnjoined: return "capture sequence contains a fork that was not joined to the primary stream";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
    default: return cudaGetErrorName(e);
    }
}

cudaError_t cudaGetLastError(void)
{
    LOCK();
    cudaError_t e = last_error;
    last_error = sticky;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    LOCK();
    return last_error;
}

static int n_devices(void)
{
    const char *s = getenv("CUDAEMU_DEVICES");
    int n = s ? atoi(s) : 2;
    return n < 0 ? 0 : n > 16 ? 16 : n;
}

static thread_local int cur_device;

} /* extern "C" */

int cudaemu::current_device(void)
{
    return cur_device;
}

extern "C" {

cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return set_error(cudaErrorInvalidValue);
    *count = n_devices();
    return *count ? cudaSuccess : set_error(cudaErrorNoDevice);
}

cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return set_error(cudaErrorInvalidValue);
    *device = cur_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    LOCK();
    STICKY();
    if (device < 0 || device >= n_devices())
        return set_error(cudaErrorInvalidDevice);
    cur_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    if (!p)
        return set_error(cudaErrorInvalidValue);
    if (device < 0 || device >= n_devices())
        return set_error(cudaErrorInvalidDevice);
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "NVIDIA H100 80GB HBM3 (cudaemu, emulated on the CPU)");
    const char *gb = getenv("CUDAEMU_MEM_GB");
    p->totalGlobalMem = (size_t)(gb && atoi(gb) > 0 ? atoi(gb) : 16) << 30;
    p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = 232448;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
    p->major = 9, p->minor = 0;
    p->multiProcessorCount = 132;
    p->unifiedAddressing = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int device)
{
    struct cudaDeviceProp p;
    if (!v)
        return set_error(cudaErrorInvalidValue);
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e)
        return e;
    switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxGridDimY: *v = p.maxGridSize[1]; break;
    case cudaDevAttrMaxGridDimZ: *v = p.maxGridSize[2]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrWarpSize: *v = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *v = p.multiProcessorCount; break;
    case cudaDevAttrUnifiedAddressing: *v = 1; break;
    case cudaDevAttrComputeCapabilityMajor: *v = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *v = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)p.sharedMemPerBlockOptin; break;
    default: return set_error(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaemu_func_set_attribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    LOCK();
    STICKY();
    if (!func || attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        value > 232448)
        return set_error(cudaErrorInvalidValue);
    exec_set_max_dyn_smem(func, value);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    LOCK();
    STICKY();
    cudaError_t e = capture_check_unsafe("cudaDeviceSynchronize");
    return e ? e : wait_for(all_idle);
}

/* ---- streams ------------------------------------------------------------------------- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags)
{
    LOCK();
    STICKY();
    if (!stream || flags & ~cudaStreamNonBlocking)
        return set_error(cudaErrorInvalidValue);
    mem_init();
    streams.emplace_back(new cudaemu_stream{flags, false, false, 0, 0, {}, NULL, {}});
    *stream = streams.back().get();
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream)
{
    return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    LOCK();
    STICKY();
    cudaemu_stream *s = S(stream);
    if (s->legacy || s->destroyed)
        return set_error(cudaErrorInvalidResourceHandle);
    if (s->cap)
        return set_error(cudaErrorIllegalState);
    /* Its queued work still runs, as on a GPU; the struct stays for events
     * that name it. */
    s->destroyed = true;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    LOCK();
    STICKY();
    cudaemu_stream *s = S(stream);
    if (s->cap) {
        capture_invalidate(s->cap, "cudaStreamSynchronize");
        return set_error(cudaErrorStreamCaptureUnsupported);
    }
    return sync_stream(s);
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    LOCK();
    STICKY();
    cudaemu_stream *s = S(stream);
    if (s->cap) {
        capture_invalidate(s->cap, "cudaStreamQuery");
        return set_error(cudaErrorStreamCaptureUnsupported);
    }
    /* A GPU makes progress while the host polls: run one command. */
    drain([s] { return stream_idle(s); }, 1);
    if (sticky)
        return set_error(sticky);
    return stream_idle(s) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status)
{
    LOCK();
    if (!status)
        return set_error(cudaErrorInvalidValue);
    cudaemu_stream *s = S(stream);
    *status = !s->cap ? cudaStreamCaptureStatusNone
              : s->cap->invalid ? cudaStreamCaptureStatusInvalidated
                                : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

/* ---- events ---------------------------------------------------------------------------- */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags)
{
    LOCK();
    STICKY();
    if (!event || flags & ~(cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess))
        return set_error(cudaErrorInvalidValue);
    if (flags & cudaEventInterprocess)
        return set_error(cudaErrorNotSupported); /* not used by baton */
    *event = new cudaemu_event{flags, false, NULL, 0, NULL, {}};
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    LOCK();
    if (!event)
        return set_error(cudaErrorInvalidResourceHandle);
    delete event;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream)
{
    LOCK();
    STICKY();
    if (!e)
        return set_error(cudaErrorInvalidResourceHandle);
    cudaemu_stream *s = S(stream);
    if (s->cap) {
        if (s->cap->invalid)
            return set_error(cudaErrorStreamCaptureInvalidated);
        e->cap = s->cap;
        e->nodes = s->tail;
        e->recorded = true;
        return cudaSuccess;
    }
    /* A marker command, so the legacy stream's implicit waits apply. */
    cudaError_t r = stream_enqueue(stream, "event record", [] {});
    if (r)
        return r;
    e->cap = NULL;
    e->recorded = true;
    e->s = s;
    e->seq = s->enq;
    return cudaSuccess;
}

static bool event_done(const cudaemu_event *e)
{
    return !e->recorded || e->s->done >= e->seq;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned flags)
{
    LOCK();
    STICKY();
    if (!e || flags)
        return set_error(!e ? cudaErrorInvalidResourceHandle : cudaErrorInvalidValue);
    cudaemu_stream *s = S(stream);
    if (e->cap) {
        capture *c = e->cap;
        if (std::find(captures.begin(), captures.end(), c) == captures.end())
            return set_error(cudaErrorIllegalState); /* that capture has ended */
        if (s->cap && s->cap != c)
            return set_error(cudaErrorIllegalState); /* two captures cannot merge */
        if (c->invalid)
            return set_error(cudaErrorStreamCaptureInvalidated);
        if (s->legacy)
            return set_error(cudaErrorStreamCaptureImplicit);
        if (!s->cap) {
            s->cap = c; /* the stream joins the capture */
            s->tail = e->nodes;
        } else {
            for (int n : e->nodes)
                if (std::find(s->tail.begin(), s->tail.end(), n) == s->tail.end())
                    s->tail.push_back(n);
        }
        return cudaSuccess;
    }
    if (s->cap) /* a capture may not wait on work outside it */
        return set_error(cudaErrorIllegalState);
    if (!e->recorded)
        return cudaSuccess;
    dep d = {e->s, e->seq};
    cudaError_t r = stream_enqueue(stream, "event wait", [] {});
    if (r)
        return r;
    s->q.back().deps.push_back(d);
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    LOCK();
    STICKY();
    if (!e)
        return set_error(cudaErrorInvalidResourceHandle);
    if (e->cap)
        return set_error(cudaErrorStreamCaptureUnsupported);
    return wait_for([e] { return event_done(e); });
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    LOCK();
    STICKY();
    if (!e)
        return set_error(cudaErrorInvalidResourceHandle);
    if (e->cap)
        return set_error(cudaErrorStreamCaptureUnsupported);
    drain([e] { return event_done(e); }, 1);
    if (sticky)
        return set_error(sticky);
    return event_done(e) ? cudaSuccess : cudaErrorNotReady;
}

/* The emulator measures nothing: an elapsed time from it would be a lie. */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    (void)a;
    (void)b;
    if (ms)
        *ms = 0;
    return set_error(cudaErrorNotSupported);
}

/* ---- capture and graphs ----------------------------------------------------------------- */

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    LOCK();
    STICKY();
    cudaemu_stream *s = S(stream);
    if (s->legacy)
        return set_error(cudaErrorStreamCaptureUnsupported);
    if (s->cap || mode > cudaStreamCaptureModeRelaxed)
        return set_error(s->cap ? cudaErrorIllegalState : cudaErrorInvalidValue);
    capture *c = new capture{mode, std::this_thread::get_id(), s, false, NULL, {}};
    captures.push_back(c);
    s->cap = c;
    s->tail.clear();
    return cudaSuccess;
}

/* Marks in SEEN every node that N depends on, N included. */
static void mark_ancestors(const std::vector<gnode> &nodes, int n, std::vector<char> &seen)
{
    std::vector<int> todo(1, n);
    while (!todo.empty()) {
        int i = todo.back();
        todo.pop_back();
        if (seen[i])
            continue;
        seen[i] = 1;
        for (int d : nodes[i].deps)
            todo.push_back(d);
    }
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph)
{
    LOCK();
    STICKY();
    cudaemu_stream *s = S(stream);
    capture *c = s->cap;
    if (!graph || !c)
        return set_error(!graph ? cudaErrorInvalidValue : cudaErrorIllegalState);
    *graph = NULL;
    if (c->origin != s)
        return set_error(cudaErrorIllegalState);
    if (c->mode != cudaStreamCaptureModeRelaxed && c->owner != std::this_thread::get_id())
        return set_error(cudaErrorStreamCaptureWrongThread);
    cudaError_t e = cudaSuccess;
    if (c->invalid) {
        e = cudaErrorStreamCaptureInvalidated;
    } else {
        /* Every node must lead into the origin stream's last work: a fork
         * that never joined back is an error. */
        std::vector<char> seen(c->nodes.size(), 0);
        for (int n : s->tail)
            mark_ancestors(c->nodes, n, seen);
        for (char x : seen)
            if (!x)
                e = cudaErrorStreamCaptureUnjoined;
    }
    if (e == cudaSuccess)
        *graph = new cudaemu_graph{std::move(c->nodes)};
    for (auto &o : streams)
        if (o->cap == c) {
            o->cap = NULL;
            o->tail.clear();
        }
    s->cap = NULL;
    captures.erase(std::find(captures.begin(), captures.end(), c));
    delete c;
    return e ? set_error(e) : e;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    LOCK();
    STICKY();
    if (!exec || !graph || flags)
        return set_error(cudaErrorInvalidValue);
    *exec = new cudaemu_graph_exec{std::make_shared<const std::vector<gnode>>(graph->nodes)};
    return cudaSuccess;
}

/* One command that runs the graph's nodes in a seeded order that respects
 * their dependencies (nodes without a path between them may run in any
 * order on a GPU, so here they do too). */
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream)
{
    LOCK();
    STICKY();
    if (!exec)
        return set_error(cudaErrorInvalidResourceHandle);
    if (S(stream)->cap)
        return set_error(cudaErrorNotSupported); /* graphs inside graphs: not used */
    std::shared_ptr<const std::vector<gnode>> nodes = exec->nodes;
    return stream_enqueue(stream, "graph launch", [nodes] {
        size_t n = nodes->size();
        std::vector<int> waiting(n, 0);
        std::vector<std::vector<int>> next(n);
        for (size_t i = 0; i < n; i++)
            for (int d : (*nodes)[i].deps) {
                waiting[i]++;
                next[d].push_back((int)i);
            }
        std::vector<int> ready;
        for (size_t i = 0; i < n; i++)
            if (!waiting[i])
                ready.push_back((int)i);
        while (!ready.empty() && !sticky) {
            size_t k = rng() % ready.size();
            int i = ready[k];
            ready[k] = ready.back();
            ready.pop_back();
            (*nodes)[i].fn();
            for (int j : next[i])
                if (--waiting[j] == 0)
                    ready.push_back(j);
        }
    });
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    LOCK();
    delete graph;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    LOCK();
    delete exec;
    return cudaSuccess;
}

/* ---- copies and memsets ------------------------------------------------------------------ */

/* Checks both ends of a copy against its kind (cudaMemcpyDefault infers
 * it from the pointers) and that a device range lies in one allocation. */
static cudaError_t copy_check(void *dst, const void *src, size_t n, enum cudaMemcpyKind k)
{
    if (!dst || !src)
        return cudaErrorInvalidValue;
    bool dd = mem_is_device(dst, n), sd = mem_is_device(src, n);
    bool dany = mem_is_device(dst, 1), sany = mem_is_device(src, 1);
    if ((dany && !dd) || (sany && !sd)) {
        problem("copy of %zu bytes runs past a device allocation (%s)", n,
                mem_describe(dany && !dd ? dst : src).c_str());
        return cudaErrorInvalidValue;
    }
    switch (k) {
    case cudaMemcpyHostToHost: return !dd && !sd ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyHostToDevice: return dd && !sd ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost: return !dd && sd ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice: return dd && sd ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDefault: return cudaSuccess;
    }
    return cudaErrorInvalidMemcpyDirection;
}

static cudaError_t copy_enqueue(void *dst, const void *src, size_t n, enum cudaMemcpyKind k,
                                cudaStream_t stream)
{
    if (!n)
        return cudaSuccess;
    cudaError_t e = copy_check(dst, src, n, k);
    if (e)
        return set_error(e);
    bool host_src = !mem_is_device(src, n);
    if (host_src && !S(stream)->cap) {
        /* From pageable host memory CUDA stages the bytes before the call
         * returns, so the caller may reuse its buffer at once. */
        auto staged = std::make_shared<std::vector<uint8_t>>((const uint8_t *)src,
                                                             (const uint8_t *)src + n);
        return enqueue(stream, "copy", [dst, staged] {
            mem_open_range(dst, staged->size());
            memcpy(dst, staged->data(), staged->size());
            mem_close_range(dst, staged->size());
        }, nullptr, true);
    }
    return enqueue(stream, "copy", [dst, src, n] {
        mem_open_range(dst, n);
        mem_open_range(src, n);
        memmove(dst, src, n);
        mem_close_range(src, n);
        mem_close_range(dst, n);
    }, nullptr, true);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t stream)
{
    LOCK();
    STICKY();
    return copy_enqueue(dst, src, n, k, stream);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k)
{
    LOCK();
    STICKY();
    cudaError_t e = capture_check_unsafe("cudaMemcpy");
    if (!e)
        e = copy_enqueue(dst, src, n, k, NULL);
    if (!e)
        e = sync_stream(&legacy_stream);
    return e;
}

static cudaError_t memset_enqueue(void *p, int v, size_t n, cudaStream_t stream)
{
    if (!n)
        return cudaSuccess;
    if (!mem_is_device(p, n)) {
        if (mem_is_device(p, 1))
            problem("memset of %zu bytes runs past a device allocation (%s)", n,
                    mem_describe(p).c_str());
        return set_error(cudaErrorInvalidValue);
    }
    return enqueue(stream, "memset", [p, v, n] {
        mem_open_range(p, n);
        memset(p, v, n);
        mem_close_range(p, n);
    }, nullptr, true);
}

/* Asynchronous on the legacy default stream, as CUDA's is for device
 * memory: it is ordered with blocking streams only. */
cudaError_t cudaMemset(void *p, int v, size_t n)
{
    LOCK();
    STICKY();
    return memset_enqueue(p, v, n, NULL);
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t stream)
{
    LOCK();
    STICKY();
    return memset_enqueue(p, v, n, stream);
}

void cudaemu_seed(unsigned long long seed)
{
    LOCK();
    seed_from(seed);
}

unsigned long cudaemu_problems(void)
{
    LOCK();
    return n_problems;
}

} /* extern "C" */
