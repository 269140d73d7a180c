/* cudaemu device memory: allocations, protection, IPC and the fault report.
 *
 * Device memory is one memfd, mapped once and closed to host code: a host
 * dereference of a device pointer faults, as it does on a machine with a
 * GPU, and the SIGSEGV handler names the allocation.  Device work opens it
 * (mem_open) and closes it again.  Where the CPU has memory protection keys
 * (x86 PKU), every allocation carries one key and opening is a write to the
 * thread's PKRU register: cheap, and only the thread running device work
 * gains access.  Elsewhere each allocation is mprotect()ed at every open and
 * close, which costs page-table work in proportion to the allocations live;
 * copies and memsets therefore open only the allocations they touch
 * (mem_open_range).  Each allocation sits at
 * the end of its own pages, 256-aligned, with a guard page after it that is
 * never opened, so a kernel that writes past its buffer faults too.  Freed
 * spans wait in a quarantine before reuse, closed, so that a late use of
 * freed memory faults rather than reading someone else's data.
 *
 * A forked child gets its own device memory, a copy of its parent's live
 * allocations (a child of a CUDA process cannot use CUDA at all; here it
 * can, which lets tests fork ranks and peers), so that the two processes do
 * not write each other's memory through the one file they would share.
 *
 * The memfd is what makes CUDA IPC work between processes:
 * cudaIpcGetMemHandle names (pid, fd, offset, size) and another process
 * maps /proc/PID/fd/FD at that offset.  Several processes thus share one
 * emulated GPU's memory, as several workers share one real GPU. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <deque>
#include <map>

#include "cudaemu/emu.h"

namespace cudaemu {

static const size_t PAGE = 4096;
static const size_t ALIGN = 256; /* cudaMalloc's alignment */
/* Imports get their own reserved range, 64 GiB of address space. */
static const size_t IMPORT_CAP = (size_t)64 << 30;
/* Freed spans stay closed until this many bytes were freed after them. */
static const size_t QUARANTINE_BYTES = (size_t)256 << 20;
static const size_t POISON_BYTES = (size_t)64 << 20;

struct span {
    size_t off;   /* bytes from the arena's start, page-aligned */
    size_t pages; /* data pages, the guard page not included */
};

struct alloc {
    span sp;
    size_t size;     /* bytes the caller asked for */
    uint64_t serial; /* distinguishes reuses of one address in IPC handles */
    int device;      /* current at cudaMalloc */
};

struct import {
    void *map;       /* the mapping (page-aligned) */
    size_t map_len;  /* bytes */
    size_t size;     /* the exported allocation's bytes */
    int refs;        /* opens not yet closed */
    pid_t pid;       /* exporter */
    uint64_t key;    /* exporter's offset, for reopening */
    uint64_t serial;
    int device;      /* the exporter's */
};

static int arena_fd = -1;
static uint8_t *arena;    /* ARENA_CAP bytes, MAP_SHARED on arena_fd */
static size_t arena_cap;  /* bytes */
static size_t arena_top;  /* bytes handed out so far, page-aligned */
static uint8_t *imports;  /* IMPORT_CAP bytes of PROT_NONE reservation */
static size_t import_top; /* bytes of it used, page-aligned */
static std::map<uintptr_t, alloc> live;      /* by the pointer returned */
static std::multimap<size_t, size_t> free_;  /* pages -> offset */
static std::deque<span> quarantine;
static size_t quarantine_bytes;
static std::map<uintptr_t, import> opened;   /* by the pointer returned */
static uint64_t next_serial = 1;
static size_t allocated;
static int open_depth;
static int pkey = -1; /* the protection key of device memory, or -1: mprotect */

static size_t pages_of(size_t n)
{
    return (n + PAGE - 1) / PAGE;
}

static void segv_handler(int sig, siginfo_t *si, void *uc);
static struct sigaction old_segv;
static void at_fork_child(void);

void mem_init(void)
{
    if (arena)
        return;
    const char *gb = getenv("CUDAEMU_MEM_GB");
    arena_cap = (size_t)(gb && atoi(gb) > 0 ? atoi(gb) : 16) << 30;
    arena_fd = memfd_create("cudaemu-device", MFD_CLOEXEC);
    if (arena_fd < 0 || ftruncate(arena_fd, (off_t)arena_cap) < 0) {
        fprintf(stderr, "cudaemu: cannot make the device memory file: %s\n", strerror(errno));
        abort();
    }
    void *a = mmap(NULL, arena_cap, PROT_NONE, MAP_SHARED | MAP_NORESERVE, arena_fd, 0);
    void *r = mmap(NULL, IMPORT_CAP, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                   0);
    if (a == MAP_FAILED || r == MAP_FAILED) {
        fprintf(stderr, "cudaemu: cannot reserve device memory: %s\n", strerror(errno));
        abort();
    }
    arena = (uint8_t *)a;
    imports = (uint8_t *)r;
    /* Threads start with access to a new key disabled (Linux's default
     * PKRU), and this one too from here on. */
    if (!getenv("CUDAEMU_NO_PKEYS"))
        pkey = pkey_alloc(0, PKEY_DISABLE_ACCESS);
    install_fault_handler();
    pthread_atfork(NULL, NULL, at_fork_child);
}

void install_fault_handler(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = segv_handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
}

static uint8_t *span_addr(const span &s)
{
    return arena + s.off;
}

static void protect(uint8_t *p, size_t len, int prot)
{
    if (len && mprotect(p, len, prot) != 0) {
        fprintf(stderr, "cudaemu: mprotect: %s\n", strerror(errno));
        abort();
    }
}

static int data_prot(void)
{
    return pkey >= 0 || open_depth > 0 ? PROT_READ | PROT_WRITE : PROT_NONE;
}

/* Makes [P, P+LEN) device memory: readable and writable under the key, or
 * as open or closed as device memory is now. */
static void protect_data(uint8_t *p, size_t len)
{
    if (pkey >= 0) {
        if (len && pkey_mprotect(p, len, PROT_READ | PROT_WRITE, pkey) != 0) {
            fprintf(stderr, "cudaemu: pkey_mprotect: %s\n", strerror(errno));
            abort();
        }
    } else {
        protect(p, len, data_prot());
    }
}

/* In a forked child: a new memory file holding a copy of every live
 * allocation, mapped where the parent's was. */
static void at_fork_child(void)
{
    int fd = memfd_create("cudaemu-device", MFD_CLOEXEC);
    void *m = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, (off_t)arena_cap) == 0)
        m = mmap(NULL, arena_cap, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (m == MAP_FAILED) {
        static const char msg[] = "cudaemu: a forked child cannot copy its device memory\n";
        if (write(2, msg, sizeof(msg) - 1) < 0)
            (void)0;
        _exit(99);
    }
    open_depth++;
    if (pkey >= 0)
        pkey_set(pkey, 0);
    for (auto &kv : live) {
        if (pkey < 0)
            protect(span_addr(kv.second.sp), kv.second.sp.pages * PAGE, PROT_READ);
        memcpy((uint8_t *)m + kv.second.sp.off, span_addr(kv.second.sp), kv.second.sp.pages * PAGE);
    }
    munmap(m, arena_cap);
    if (mmap(arena, arena_cap, PROT_NONE, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd, 0) ==
        MAP_FAILED)
        _exit(99);
    close(arena_fd);
    arena_fd = fd;
    open_depth--;
    for (auto &kv : live)
        protect_data(span_addr(kv.second.sp), kv.second.sp.pages * PAGE);
    if (pkey >= 0)
        pkey_set(pkey, open_depth > 0 ? 0 : PKEY_DISABLE_ACCESS);
}

void mem_open(void)
{
    if (open_depth++ > 0)
        return;
    if (pkey >= 0) {
        pkey_set(pkey, 0);
        return;
    }
    for (auto &kv : live)
        protect(span_addr(kv.second.sp), kv.second.sp.pages * PAGE, PROT_READ | PROT_WRITE);
    for (auto &kv : opened)
        protect((uint8_t *)kv.second.map, kv.second.map_len, PROT_READ | PROT_WRITE);
}

void mem_close(void)
{
    if (--open_depth > 0)
        return;
    if (pkey >= 0) {
        pkey_set(pkey, PKEY_DISABLE_ACCESS);
        return;
    }
    for (auto &kv : live)
        protect(span_addr(kv.second.sp), kv.second.sp.pages * PAGE, PROT_NONE);
    for (auto &kv : opened)
        protect((uint8_t *)kv.second.map, kv.second.map_len, PROT_NONE);
}

/* A span of PAGES data pages plus its guard: first fit among freed spans of
 * exactly that size, else from the top. */
static bool span_take(size_t pages, span *out)
{
    auto it = free_.lower_bound(pages);
    if (it != free_.end() && it->first == pages) {
        *out = {it->second, pages};
        free_.erase(it);
        return true;
    }
    size_t need = (pages + 1) * PAGE;
    if (arena_top + need > arena_cap)
        return false;
    *out = {arena_top, pages};
    arena_top += need;
    return true;
}

static void span_release(const span &s)
{
    quarantine.push_back(s);
    quarantine_bytes += s.pages * PAGE;
    while (quarantine_bytes > QUARANTINE_BYTES && !quarantine.empty()) {
        span old = quarantine.front();
        quarantine.pop_front();
        quarantine_bytes -= old.pages * PAGE;
        /* Give the pages back to the kernel: a freed span costs nothing. */
        fallocate(arena_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)old.off,
                  (off_t)(old.pages * PAGE));
        free_.insert({old.pages, old.off});
    }
}

/* The entry of M (allocations or IPC mappings, by base address) whose
 * [base, base + size) holds [A, A + N); NULL when none does. */
template <class Map>
static typename Map::mapped_type *holding(Map &m, uintptr_t a, size_t n)
{
    auto it = m.upper_bound(a);
    if (it == m.begin())
        return NULL;
    --it;
    return a >= it->first && a + n <= it->first + it->second.size ? &it->second : NULL;
}

/* The pages of the allocation or mapping holding [P, P+N) into *AT and
 * *LEN; false for host memory. */
static bool range_pages(const void *p, size_t n, uint8_t **at, size_t *len)
{
    if (const alloc *a = holding(live, (uintptr_t)p, n)) {
        *at = span_addr(a->sp);
        *len = a->sp.pages * PAGE;
        return true;
    }
    if (const import *im = holding(opened, (uintptr_t)p, n)) {
        *at = (uint8_t *)im->map;
        *len = im->map_len;
        return true;
    }
    return false;
}

static void range_protect(const void *p, size_t n, int prot)
{
    uint8_t *at;
    size_t len;
    if (range_pages(p, n, &at, &len))
        protect(at, len, prot);
}

void mem_open_range(const void *p, size_t n)
{
    if (pkey >= 0 || open_depth > 0)
        mem_open();
    else
        range_protect(p, n, PROT_READ | PROT_WRITE);
}

void mem_close_range(const void *p, size_t n)
{
    if (pkey >= 0 || open_depth > 0)
        mem_close();
    else
        range_protect(p, n, PROT_NONE);
}

bool mem_is_device(const void *p, size_t n)
{
    return holding(live, (uintptr_t)p, n) || holding(opened, (uintptr_t)p, n);
}

bool mem_alloc_base(const void *p, size_t *n)
{
    auto it = live.find((uintptr_t)p);
    if (it == live.end())
        return false;
    *n = it->second.size;
    return true;
}

std::string mem_describe(const void *p)
{
    char buf[200];
    uintptr_t a = (uintptr_t)p;
    auto it = live.upper_bound(a);
    if (it != live.begin()) {
        --it;
        uintptr_t end = (uintptr_t)span_addr(it->second.sp) + (it->second.sp.pages + 1) * PAGE;
        if (a >= it->first && a < end) {
            snprintf(buf, sizeof(buf), "%zu bytes past the start of an allocation of %zu bytes%s",
                     (size_t)(a - it->first), it->second.size,
                     a >= it->first + it->second.size ? " (out of bounds)" : "");
            return buf;
        }
    }
    for (auto &s : quarantine)
        if (a >= (uintptr_t)span_addr(s) && a < (uintptr_t)span_addr(s) + s.pages * PAGE)
            return "freed device memory";
    if (a >= (uintptr_t)imports && a < (uintptr_t)imports + IMPORT_CAP)
        return "an IPC mapping, closed or out of bounds";
    if (a >= (uintptr_t)arena && a < (uintptr_t)arena + arena_cap)
        return "device memory no allocation owns";
    return "not device memory";
}

/* ---- faults ------------------------------------------------------------------- */

static bool in_device_range(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    return (arena && a >= (uintptr_t)arena && a < (uintptr_t)arena + arena_cap) ||
           (imports && a >= (uintptr_t)imports && a < (uintptr_t)imports + IMPORT_CAP);
}

static void segv_handler(int sig, siginfo_t *si, void *uc)
{
    /* A fault in a kernel is reported there, and the launch fails unless
     * this is a sanitizer build (then the process dies, as below). */
    bool kernel = exec_on_fault(si->si_addr);
    if (!kernel && in_device_range(si->si_addr)) {
        char msg[320];
        int n = snprintf(msg, sizeof(msg),
                         "cudaemu: host code dereferenced device address %p (%s); on a GPU this "
                         "is a segmentation fault too\n",
                         si->si_addr, mem_describe(si->si_addr).c_str());
        if (write(2, msg, (size_t)n) < 0)
            (void)0;
    }
    /* Ours: the process dies of the fault, as it would with a GPU (a test
     * framework's handler must not resume it).  Not ours: the previous
     * handler (a sanitizer's) or the default action.  Either way by
     * faulting again on return. */
    if (kernel || in_device_range(si->si_addr))
        signal(SIGSEGV, SIG_DFL);
    else
        sigaction(SIGSEGV, &old_segv, NULL);
    (void)sig;
    (void)uc;
}

/* ---- IPC ---------------------------------------------------------------------- */

struct ipc_handle {
    char magic[8]; /* "cudaemu" */
    int32_t pid;
    int32_t fd;
    uint64_t off;  /* of the allocation's first byte in the memfd */
    uint64_t size; /* bytes */
    uint64_t serial;
    int32_t device;
};
static_assert(sizeof(ipc_handle) <= sizeof(cudaIpcMemHandle_t), "IPC handle too large");

} /* namespace cudaemu */

using namespace cudaemu;

extern "C" {

cudaError_t cudaMalloc(void **ptr, size_t bytes)
{
    std::lock_guard<emu_mutex> g(emu_lock);
    if (sticky_error())
        return sticky_error();
    if (!ptr)
        return set_error(cudaErrorInvalidValue);
    *ptr = NULL;
    cudaError_t e = capture_check_unsafe("cudaMalloc");
    if (e)
        return e;
    mem_init();
    size_t n = bytes ? bytes : 1;
    size_t body = (n + ALIGN - 1) / ALIGN * ALIGN;
    span s;
    if (body < n || !span_take(pages_of(body), &s))
        return set_error(cudaErrorMemoryAllocation);
    uint8_t *p = span_addr(s) + s.pages * PAGE - body;
    protect_data(span_addr(s), s.pages * PAGE);
    live[(uintptr_t)p] = {s, n, next_serial++, current_device()};
    allocated += n;
    /* cudaMalloc's memory holds whatever was there: fill it with 0xff
     * bytes (NaN as float, -1 as int) so that code which needs zeros and
     * forgot to write them fails here too.  Only the first POISON_BYTES:
     * a pool of gigabytes would otherwise be resident at once. */
    mem_open_range(p, n);
    memset(p, 0xff, n < POISON_BYTES ? n : POISON_BYTES);
    mem_close_range(p, n);
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr)
{
    std::lock_guard<emu_mutex> g(emu_lock);
    if (sticky_error())
        return sticky_error();
    if (!ptr)
        return cudaSuccess;
    auto it = live.find((uintptr_t)ptr);
    if (it == live.end())
        return set_error(cudaErrorInvalidDevicePointer);
    /* cudaFree waits for the device's work, as the real one does. */
    cudaError_t e = cudaDeviceSynchronize();
    if (e)
        return e;
    protect(span_addr(it->second.sp), it->second.sp.pages * PAGE, PROT_NONE);
    allocated -= it->second.size;
    span_release(it->second.sp);
    live.erase(it);
    return cudaSuccess;
}

void cudaemu_install_fault_handler(void)
{
    std::lock_guard<emu_mutex> g(emu_lock);
    install_fault_handler();
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr)
{
    std::lock_guard<emu_mutex> g(emu_lock);
    if (!attr)
        return set_error(cudaErrorInvalidValue);
    memset(attr, 0, sizeof(*attr));
    const alloc *al = holding(live, (uintptr_t)ptr, 1);
    const import *im = al ? NULL : holding(opened, (uintptr_t)ptr, 1);
    if (al || im) {
        attr->type = cudaMemoryTypeDevice;
        attr->device = al ? al->device : im->device;
        attr->devicePointer = (void *)ptr;
        return cudaSuccess;
    }
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2; /* CUDA's value for host memory */
    attr->hostPointer = (void *)ptr;
    return cudaSuccess;
}

size_t cudaemu_bytes_allocated(void)
{
    std::lock_guard<emu_mutex> g(emu_lock);
    return allocated;
}

int cudaemu_is_device_ptr(const void *p)
{
    std::lock_guard<emu_mutex> g(emu_lock);
    return mem_is_device(p, 1);
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *ptr)
{
    std::lock_guard<emu_mutex> g(emu_lock);
    if (sticky_error())
        return sticky_error();
    auto it = live.find((uintptr_t)ptr);
    if (!handle || it == live.end())
        return set_error(cudaErrorInvalidValue); /* only an allocation's base exports */
    ipc_handle h;
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, "cudaemu", 8);
    h.pid = (int32_t)getpid();
    h.fd = arena_fd;
    h.off = (uint64_t)((uint8_t *)ptr - arena);
    h.size = it->second.size;
    h.serial = it->second.serial;
    h.device = it->second.device;
    memset(handle, 0, sizeof(*handle));
    memcpy(handle->reserved, &h, sizeof(h));
    return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void **ptr, cudaIpcMemHandle_t handle, unsigned flags)
{
    std::lock_guard<emu_mutex> g(emu_lock);
    if (sticky_error())
        return sticky_error();
    ipc_handle h;
    memcpy(&h, handle.reserved, sizeof(h));
    if (!ptr || memcmp(h.magic, "cudaemu", 8) != 0 || flags & ~cudaIpcMemLazyEnablePeerAccess)
        return set_error(cudaErrorInvalidValue);
    *ptr = NULL;
    /* CUDA refuses a handle in the process that exported it. */
    if (h.pid == (int32_t)getpid())
        return set_error(cudaErrorDeviceUninitialized);
    mem_init();
    for (auto &kv : opened)
        if (kv.second.pid == h.pid && kv.second.key == h.off && kv.second.serial == h.serial) {
            kv.second.refs++;
            *ptr = (void *)kv.first;
            return cudaSuccess;
        }
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)h.pid, (int)h.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return set_error(cudaErrorInvalidResourceHandle); /* the exporter is gone */
    size_t first = h.off / PAGE * PAGE;
    size_t len = pages_of(h.off + h.size) * PAGE - first;
    if (import_top + len > IMPORT_CAP) {
        close(fd);
        return set_error(cudaErrorMemoryAllocation);
    }
    void *m = mmap(imports + import_top, len, PROT_NONE, MAP_SHARED | MAP_FIXED, fd, (off_t)first);
    close(fd);
    if (m == MAP_FAILED)
        return set_error(cudaErrorInvalidResourceHandle);
    protect_data((uint8_t *)m, len);
    /* Address space is not reused, so a stale pointer into a closed
     * mapping faults (one guard page between imports). */
    import_top += len + PAGE;
    uint8_t *p = (uint8_t *)m + (h.off - first);
    opened[(uintptr_t)p] = {m, len, h.size, 1, (pid_t)h.pid, h.off, h.serial, h.device};
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void *ptr)
{
    std::lock_guard<emu_mutex> g(emu_lock);
    if (sticky_error())
        return sticky_error();
    auto it = opened.find((uintptr_t)ptr);
    if (it == opened.end())
        return set_error(cudaErrorInvalidValue);
    if (--it->second.refs > 0)
        return cudaSuccess;
    /* Work already queued may still read it: finish that first. */
    cudaError_t e = cudaDeviceSynchronize();
    if (e)
        return e;
    mmap(it->second.map, it->second.map_len, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    opened.erase(it);
    return cudaSuccess;
}

} /* extern "C" */
