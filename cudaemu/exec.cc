/* cudaemu kernel executor: every CUDA thread of a block is a fiber.
 *
 * A block runs in passes.  Each pass resumes every runnable fiber, warps in
 * a seeded order, until it stops at __syncthreads, at a warp operation
 * (__syncwarp, a shuffle, a vote) or at its end.  Then the executor
 * completes what can complete: a warp operation once every lane of its
 * mask has reached it (values exchanged as CUDA defines them), a barrier
 * once every live thread has.  So threads interleave only where CUDA lets
 * them synchronise, and code that skips a barrier reads shared memory
 * before another thread wrote it.
 *
 * What breaks CUDA's rules is a problem (reported with kernel, block,
 * thread, file and line, and failing the launch with the sticky
 * cudaErrorLaunchFailure): a barrier that some live thread returned before
 * reaching, threads of one block at different barriers, a warp operation
 * whose mask leaves out its own lane, names an exited lane, or disagrees
 * with another lane's, a shuffle reading a lane outside its mask, shared
 * memory beyond its declared size or beyond what the launch allowed
 * (48 KiB without cudaFuncSetAttribute), a host pointer as a kernel
 * argument, and any access fault inside a kernel.
 *
 * Shared memory: each __shared__ array and the dynamic area sit at the end
 * of their own pages, before a guard page, and start filled with 0xff
 * bytes (NaN as float, -1 as int) in every block, so reading what no
 * thread wrote and indexing one past the end both show. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <map>
#include <vector>

#include "cudaemu/emu.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

extern "C" void cudaemu_fiber_switch(void **save_sp, void *to_sp);

namespace cudaemu {

uint3 thread_idx, block_idx;
dim3 block_dim, grid_dim;

static const size_t PAGE = 4096;
static const int MAX_THREADS = 1024;
static const size_t SMEM_STATIC_MAX = 48 * 1024;
static const size_t SMEM_OPTIN_MAX = 232448; /* 227 KiB, an H100's opt-in limit */
static const int STATIC_SLOTS = 16;
static const size_t STATIC_SLOT_PAGES = SMEM_STATIC_MAX / PAGE;
static const size_t DYN_SLOT_PAGES = (SMEM_OPTIN_MAX + PAGE - 1) / PAGE;

enum fstate { F_READY, F_BARRIER, F_WARP, F_DONE };

struct fiber {
    void *sp;         /* saved stack pointer while suspended */
    uint8_t *stack;   /* lowest byte of its stack */
    uint3 tid;
    int lin;          /* linear thread index in the block */
    fstate state;
    const char *file; /* where it waits */
    int line;
    warp_op op;
    unsigned mask;
    uint64_t value, result;
    int arg, width;
    void *asan_fake;  /* the sanitizer's fake stack while suspended */
};

struct smem_slot {
    const void *key; /* the __shared__ declaration, NULL when free */
    const char *name;
    uint8_t *p;      /* its storage */
    size_t bytes;
};

static size_t stack_bytes;
static uint8_t *stacks;
static fiber fibers[MAX_THREADS];
static fiber *cur;
static void *sched_sp;
#if EMU_ASAN
static void *sched_fake;
static const void *sched_stack_bottom;
static size_t sched_stack_size;
#endif

static const kernel_launch *cur_k;
static bool in_kernel;
static bool failed;
static sigjmp_buf fault_jmp;
static unsigned long long n_launches, n_switches;

static uint8_t *smem;          /* STATIC_SLOTS static slots, then the dynamic one */
static smem_slot slots[STATIC_SLOTS];
static size_t static_used;     /* bytes of static shared memory in this block */
static uint8_t *dyn_ptr;
static std::map<const void *, int> max_dyn;         /* kernel -> its attribute */
static std::map<const void *, size_t> static_bytes; /* kernel -> learnt at its first run */

static uint8_t *slot_end(int i)
{
    return smem + (size_t)(i + 1) * (STATIC_SLOT_PAGES + 1) * PAGE - PAGE;
}

static uint8_t *dyn_end(void)
{
    return slot_end(STATIC_SLOTS - 1) + PAGE + DYN_SLOT_PAGES * PAGE;
}

static void init(void)
{
    if (stacks)
        return;
    stack_bytes = EMU_ASAN ? 256 * 1024 : 64 * 1024;
    size_t stride = stack_bytes + PAGE, total = stride * MAX_THREADS;
    void *s = mmap(NULL, total, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    size_t smem_len = (size_t)STATIC_SLOTS * (STATIC_SLOT_PAGES + 1) * PAGE +
                      (DYN_SLOT_PAGES + 1) * PAGE;
    void *m = mmap(NULL, smem_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED || m == MAP_FAILED) {
        fprintf(stderr, "cudaemu: cannot map fiber stacks or shared memory\n");
        abort();
    }
    stacks = (uint8_t *)s;
    for (int i = 0; i < MAX_THREADS; i++) {
        mprotect(stacks + i * stride, PAGE, PROT_NONE); /* the guard below each stack */
        fibers[i].stack = stacks + i * stride + PAGE;
    }
    smem = (uint8_t *)m;
    for (int i = 0; i < STATIC_SLOTS; i++)
        mprotect(slot_end(i), PAGE, PROT_NONE);
    mprotect(dyn_end(), PAGE, PROT_NONE);
}

static const char *op_name(warp_op op)
{
    static const char *names[] = {"__syncwarp", "__shfl_sync", "__shfl_up_sync",
                                  "__shfl_down_sync", "__shfl_xor_sync", "__ballot_sync",
                                  "__any_sync", "__all_sync"};
    return names[op];
}

/* "kernel K (file:line) block (x,y,z) thread (x,y,z)" for reports. */
static std::string where(const fiber *f)
{
    char buf[320];
    int n = snprintf(buf, sizeof(buf), "kernel %s launched at %s:%d, block (%u,%u,%u)",
                     cur_k->name, cur_k->file, cur_k->line, block_idx.x, block_idx.y,
                     block_idx.z);
    if (f)
        snprintf(buf + n, sizeof(buf) - (size_t)n, " thread (%u,%u,%u)", f->tid.x, f->tid.y,
                 f->tid.z);
    return buf;
}

/* ---- fibers --------------------------------------------------------------------- */

static void fiber_entry(void) __attribute__((noreturn, used));

static void to_scheduler(void)
{
    fiber *f = cur;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(f->state == F_DONE ? NULL : &f->asan_fake, sched_stack_bottom,
                                   sched_stack_size);
#endif
    cudaemu_fiber_switch(&f->sp, sched_sp);
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(f->asan_fake, NULL, NULL);
#endif
}

static void fiber_entry(void)
{
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &sched_stack_bottom, &sched_stack_size);
#endif
    cur_k->call->run();
    cur->state = F_DONE;
    to_scheduler();
    abort(); /* a finished fiber is never resumed */
}

static void fiber_init(fiber *f)
{
    uintptr_t *top = (uintptr_t *)(f->stack + stack_bytes);
    top[-1] = 0;
    top[-2] = (uintptr_t)fiber_entry; /* popped by the switch's ret */
    for (int i = 3; i <= 8; i++)
        top[-i] = 0;                  /* rbp, rbx, r12..r15 */
    f->sp = &top[-8];
    f->state = F_READY;
    f->asan_fake = NULL;
}

static void resume(fiber *f)
{
    cur = f;
    thread_idx = f->tid;
    n_switches++;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(&sched_fake, f->stack, stack_bytes);
#endif
    cudaemu_fiber_switch(&sched_sp, f->sp);
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(sched_fake, NULL, NULL);
#endif
    cur = NULL;
}

/* Ends the launch from inside a fiber: the block loop sees FAILED. */
static void fail_here(void)
{
    failed = true;
    cur->state = F_DONE;
    to_scheduler();
    abort();
}

void syncthreads(const char *file, int line)
{
    if (!cur) {
        problem("__syncthreads called outside a kernel at %s:%d", file, line);
        return;
    }
    cur->state = F_BARRIER;
    cur->file = file;
    cur->line = line;
    to_scheduler();
}

uint64_t warp_meet(warp_op op, unsigned mask, uint64_t value, int arg, int width,
                   const char *file, int line)
{
    if (!cur) {
        problem("%s called outside a kernel at %s:%d", op_name(op), file, line);
        return value;
    }
    fiber *f = cur;
    f->state = F_WARP;
    f->op = op;
    f->mask = mask;
    f->value = value;
    f->arg = arg;
    f->width = width;
    f->file = file;
    f->line = line;
    to_scheduler();
    return f->result;
}

/* ---- shared memory ------------------------------------------------------------------ */

void *dyn_smem(void)
{
    return dyn_ptr;
}

/* The launch's dynamic shared memory allowed with STATIC bytes of static:
 * the attribute when set, else what is left of 48 KiB. */
static size_t dyn_allowed(const void *fn, size_t stat)
{
    auto it = max_dyn.find(fn);
    if (it != max_dyn.end())
        return (size_t)it->second;
    return stat < SMEM_STATIC_MAX ? SMEM_STATIC_MAX - stat : 0;
}

void *static_smem(const void *key, size_t bytes, size_t align, const char *name)
{
    for (smem_slot &s : slots)
        if (s.key == key)
            return s.p;
    if (!cur) {
        problem("__shared__ %s used outside a kernel", name);
        abort();
    }
    int i = 0;
    while (i < STATIC_SLOTS && slots[i].key)
        i++;
    static_used += (bytes + align - 1) / align * align;
    size_t dyn = cur_k->cfg.smem;
    const char *why = NULL;
    if (i == STATIC_SLOTS)
        why = "more __shared__ arrays than the emulator has slots for (16)";
    else if (static_used > SMEM_STATIC_MAX)
        why = "static shared memory over 48 KiB";
    else if (dyn > dyn_allowed(cur_k->fn, static_used))
        why = "static plus dynamic shared memory over the limit (48 KiB, or the "
              "cudaFuncAttributeMaxDynamicSharedMemorySize set)";
    else if (static_used + dyn_allowed(cur_k->fn, static_used) > SMEM_OPTIN_MAX &&
             max_dyn.count(cur_k->fn))
        why = "static shared memory plus the dynamic attribute over 227 KiB";
    if (why) {
        problem("%s: __shared__ %s (%zu bytes): %s: %zu static + %zu dynamic bytes", where(cur).c_str(),
                name, bytes, why, static_used, dyn);
        fail_here();
    }
    uint8_t *p = (uint8_t *)((uintptr_t)(slot_end(i) - bytes) & ~(uintptr_t)(align - 1));
    memset(p, 0xff, bytes);
    slots[i] = {key, name, p, bytes};
    return p;
}

/* ---- warps ------------------------------------------------------------------------------ */

static fiber *lane_fiber(int warp, int lane, int nthreads)
{
    int i = warp * 32 + lane;
    return i < nthreads ? &fibers[i] : NULL;
}

/* Completes the warp operation that lane FIRST waits at, with every lane
 * of its mask; false (after a problem) when CUDA's rules are broken. */
static bool warp_complete(int warp, fiber *first, int nthreads)
{
    int lane0 = first->lin & 31;
    unsigned m = first->mask;
    if (!(m >> lane0 & 1)) {
        problem("%s: %s at %s:%d with mask 0x%08x, which leaves out the calling lane %d",
                where(first).c_str(), op_name(first->op), first->file, first->line, m, lane0);
        return false;
    }
    fiber *lanes[32] = {0};
    for (int l = 0; l < 32; l++) {
        if (!(m >> l & 1))
            continue;
        fiber *f = lane_fiber(warp, l, nthreads);
        if (!f || f->state == F_DONE) {
            problem("%s: %s at %s:%d with mask 0x%08x waits on lane %d, which %s",
                    where(first).c_str(), op_name(first->op), first->file, first->line, m, l,
                    f ? "has exited" : "does not exist in this block");
            return false;
        }
        if (f->state == F_BARRIER) {
            problem("%s: lane %d waits at %s at %s:%d while lane %d waits at __syncthreads at "
                    "%s:%d",
                    where(first).c_str(), lane0, op_name(first->op), first->file, first->line, l,
                    f->file, f->line);
            return false;
        }
        if (f->op != first->op || f->mask != m ||
            (f->op != WARP_SYNC && (f->line != first->line || f->file != first->file))) {
            problem("%s: lanes %d and %d of one mask disagree: %s at %s:%d (mask 0x%08x) and "
                    "%s at %s:%d (mask 0x%08x)",
                    where(first).c_str(), lane0, l, op_name(first->op), first->file,
                    first->line, m, op_name(f->op), f->file, f->line, f->mask);
            return false;
        }
        lanes[l] = f;
    }
    int w = first->width;
    if (first->op >= SHFL_IDX && first->op <= SHFL_XOR && (w < 1 || w > 32 || (w & (w - 1)))) {
        problem("%s: %s at %s:%d with width %d (a power of two up to 32 is required)",
                where(first).c_str(), op_name(first->op), first->file, first->line, w);
        return false;
    }
    uint64_t ballot = 0;
    for (int l = 0; l < 32; l++)
        if (lanes[l] && lanes[l]->value)
            ballot |= 1ull << l;
    for (int l = 0; l < 32; l++) {
        fiber *f = lanes[l];
        if (!f)
            continue;
        int seg = l & ~(w - 1), in = l & (w - 1), src = l;
        switch (f->op) {
        case WARP_SYNC: f->result = 0; break;
        case VOTE_BALLOT: f->result = ballot; break;
        case VOTE_ANY: f->result = ballot != 0; break;
        case VOTE_ALL: f->result = ballot == m; break;
        case SHFL_IDX: src = seg + (f->arg & (w - 1)); break;
        case SHFL_UP: src = in - f->arg >= 0 ? l - f->arg : l; break;
        case SHFL_DOWN: src = in + f->arg < w ? l + f->arg : l; break;
        case SHFL_XOR: src = ((l ^ f->arg) & ~(w - 1)) == seg ? (l ^ f->arg) & 31 : l; break;
        }
        if (f->op >= SHFL_IDX && f->op <= SHFL_XOR) {
            if (!lanes[src]) {
                problem("%s: %s at %s:%d: lane %d reads lane %d, outside the mask 0x%08x "
                        "(the value is undefined)",
                        where(f).c_str(), op_name(f->op), f->file, f->line, l, src, m);
                return false;
            }
            f->result = lanes[src]->value;
        }
    }
    for (int l = 0; l < 32; l++)
        if (lanes[l])
            lanes[l]->state = F_READY;
    return true;
}

/* ---- blocks ----------------------------------------------------------------------------- */

static void shuffle(std::vector<int> &v)
{
    for (size_t i = v.size(); i > 1; i--)
        std::swap(v[i - 1], v[rng() % i]);
}

static void run_block(unsigned lin_block)
{
    const launch_cfg &c = cur_k->cfg;
    block_idx = {lin_block % c.grid.x, lin_block / c.grid.x % c.grid.y,
                 lin_block / (c.grid.x * c.grid.y)};
    int n = (int)(c.block.x * c.block.y * c.block.z);
    for (int i = 0; i < n; i++) {
        fiber *f = &fibers[i];
        f->tid = {i % c.block.x, i / c.block.x % c.block.y, i / (c.block.x * c.block.y)};
        f->lin = i;
        fiber_init(f);
    }
    for (smem_slot &s : slots)
        s.key = NULL;
    static_used = 0;
    dyn_ptr = (uint8_t *)((uintptr_t)(dyn_end() - c.smem) & ~(uintptr_t)15);
    memset(dyn_ptr, 0xff, (size_t)(dyn_end() - dyn_ptr));

    int nwarps = (n + 31) / 32;
    std::vector<int> warps(nwarps);
    for (int w = 0; w < nwarps; w++)
        warps[w] = w;
    shuffle(warps);
    bool down = rng() & 1; /* lanes in falling order in this block */
    for (;;) {
        for (int w : warps)
            for (int k = 0; k < 32; k++) {
                fiber *f = lane_fiber(w, down ? 31 - k : k, n);
                if (f && f->state == F_READY) {
                    resume(f);
                    if (failed)
                        return;
                }
            }
        int done = 0;
        bool progressed = false;
        for (int w = 0; w < nwarps; w++)
            for (int l = 0; l < 32; l++) {
                fiber *f = lane_fiber(w, l, n);
                if (f && f->state == F_WARP) {
                    if (!warp_complete(w, f, n)) {
                        failed = true;
                        return;
                    }
                    progressed = true;
                }
            }
        if (progressed)
            continue;
        fiber *first_bar = NULL;
        for (int i = 0; i < n; i++) {
            done += fibers[i].state == F_DONE;
            if (fibers[i].state == F_BARRIER && !first_bar)
                first_bar = &fibers[i];
        }
        if (done == n)
            return;
        /* Only barriers are left: every live thread waits at one. */
        if (done) {
            fiber *gone = NULL;
            for (int i = 0; i < n && !gone; i++)
                if (fibers[i].state == F_DONE)
                    gone = &fibers[i];
            problem("%s: __syncthreads at %s:%d is not reached by %d thread(s) that returned "
                    "before it, e.g. thread (%u,%u,%u)",
                    where(NULL).c_str(), first_bar->file, first_bar->line, done, gone->tid.x,
                    gone->tid.y, gone->tid.z);
            failed = true;
            return;
        }
        for (int i = 0; i < n; i++) {
            fiber *f = &fibers[i];
            if (f->line != first_bar->line || f->file != first_bar->file) {
                problem("%s: threads wait at different barriers: %s:%d (thread %d) and %s:%d "
                        "(thread %d)",
                        where(NULL).c_str(), first_bar->file, first_bar->line, first_bar->lin,
                        f->file, f->line, f->lin);
                failed = true;
                return;
            }
            f->state = F_READY;
        }
    }
}

/* ---- launches ----------------------------------------------------------------------------- */

void exec_set_max_dyn_smem(const void *fn, int bytes)
{
    max_dyn[fn] = bytes;
}

cudaError_t exec_check(const kernel_launch &k)
{
    const launch_cfg &c = k.cfg;
    unsigned long long threads = (unsigned long long)c.block.x * c.block.y * c.block.z;
    if (!threads || threads > MAX_THREADS || c.block.x > 1024 || c.block.y > 1024 ||
        c.block.z > 64 || !c.grid.x || !c.grid.y || !c.grid.z || c.grid.x > 2147483647u ||
        c.grid.y > 65535 || c.grid.z > 65535)
        return cudaErrorInvalidConfiguration;
    auto it = static_bytes.find(k.fn);
    size_t stat = it == static_bytes.end() ? 0 : it->second;
    if (c.smem > dyn_allowed(k.fn, stat) || stat + c.smem > SMEM_OPTIN_MAX)
        return cudaErrorInvalidValue;
    return cudaSuccess;
}

/* Called by the SIGSEGV handler: false when no kernel runs; else reports
 * the fault and jumps back to the block loop (the launch fails), or returns
 * true in a sanitizer build, where the process must die. */
bool exec_on_fault(void *addr)
{
    if (!in_kernel || !cur)
        return false;
    const char *what = "device memory";
    std::string detail;
    if ((uint8_t *)addr >= smem && (uint8_t *)addr < dyn_end() + PAGE) {
        what = "shared memory";
        detail = "past the end of ";
        const char *name = "the dynamic shared memory";
        for (smem_slot &s : slots)
            if (s.key && (uint8_t *)addr >= s.p && (uint8_t *)addr <= s.p + s.bytes + PAGE)
                name = s.name;
        detail += name;
    } else {
        detail = mem_describe(addr);
    }
    problem("%s: illegal %s access at %p (%s)", where(cur).c_str(), what, addr, detail.c_str());
    if (EMU_ASAN)
        return true; /* the sanitizer's fiber bookkeeping cannot be unwound: die */
    siglongjmp(fault_jmp, 1);
}

static std::vector<unsigned> block_order(unsigned nblocks)
{
    std::vector<unsigned> order(nblocks);
    for (unsigned i = 0; i < nblocks; i++)
        order[i] = i;
    switch (rng() % 3) {
    case 0: break;
    case 1: std::reverse(order.begin(), order.end()); break;
    default:
        for (size_t i = order.size(); i > 1; i--)
            std::swap(order[i - 1], order[rng() % i]);
    }
    return order;
}

bool exec_run(const kernel_launch &k)
{
    init();
    n_launches++;
    cur_k = &k;
    failed = false;
    block_dim = k.cfg.block;
    grid_dim = k.cfg.grid;
    static std::vector<unsigned> order;
    order = block_order(k.cfg.grid.x * k.cfg.grid.y * k.cfg.grid.z);
    static size_t bi;
    in_kernel = true;
    if (sigsetjmp(fault_jmp, 1) == 0) {
        for (bi = 0; bi < order.size() && !failed; bi++) {
            run_block(order[bi]);
            /* A block that returns early may not reach every __shared__
             * declaration: keep the largest seen. */
            size_t &known = static_bytes[k.fn];
            if (static_used > known)
                known = static_used;
        }
    } else {
        failed = true;
        cur = NULL;
    }
    in_kernel = false;
    cur_k = NULL;
    if (failed)
        set_sticky(cudaErrorLaunchFailure);
    return !failed;
}

void launch_enqueue(const char *name, const char *file, int line, const void *fn,
                    const launch_cfg &cfg, std::shared_ptr<const kernel_call> call,
                    const void *const *ptrs, int n_ptrs)
{
    std::lock_guard<emu_mutex> g(emu_lock);
    if (sticky_error()) {
        set_error(sticky_error());
        return;
    }
    kernel_launch k = {name, file, line, fn, cfg, std::move(call)};
    cudaError_t e = exec_check(k);
    if (e) {
        set_error(e);
        return;
    }
    for (int i = 0; i < n_ptrs; i++) {
        const uint8_t *p = (const uint8_t *)ptrs[i];
        if (p && !mem_is_device(p, 1) && !mem_is_device(p - 1, 1)) {
            problem("kernel %s launched at %s:%d: pointer argument %p is not device memory (%s)",
                    name, file, line, (const void *)p, mem_describe(p).c_str());
            set_sticky(cudaErrorIllegalAddress);
            return;
        }
    }
    stream_enqueue(cfg.stream, name, [k] { exec_run(k); });
}

} /* namespace cudaemu */

extern "C" unsigned long long cudaemu_launches(void)
{
    std::lock_guard<cudaemu::emu_mutex> g(cudaemu::emu_lock);
    return cudaemu::n_launches;
}

extern "C" unsigned long long cudaemu_switches(void)
{
    std::lock_guard<cudaemu::emu_mutex> g(cudaemu::emu_lock);
    return cudaemu::n_switches;
}
