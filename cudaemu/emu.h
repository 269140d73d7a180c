/* cudaemu internals shared by memory.cc, streams.cc, exec.cc and the
 * library stand-ins (blas.cc, nccl.cc).  Not seen by emulated programs.
 *
 * One lock (emu_lock) serialises the whole emulator: the CUDA calls of
 * every host thread and all device work, which runs on the host thread
 * that waits for it (a synchronisation point drains the streams it needs).
 * Inside, everything is single-threaded.  The lock is let go of, entirely,
 * while a thread waits for another process (a collective whose peer rank
 * has not arrived) and between two commands when another thread asks for
 * it: on a GPU, a host thread's CUDA call never waits for a kernel of
 * another stream, so a process whose compute thread waits in an
 * all-reduce must still be able to copy, map and launch from its other
 * threads (a worker's I/O thread sends the very message the peer rank
 * waits for).  No device memory is open while the lock is free. */
#ifndef CUDAEMU_EMU_H
#define CUDAEMU_EMU_H

#include <stdint.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cuda_runtime.h"

namespace cudaemu {

/* The emulator's one lock: recursive like std::recursive_mutex, and able
 * to be let go of entirely by its holder and taken back at the same depth
 * (a lock_guard above the call keeps working). */
class emu_mutex {
public:
    void lock();
    void unlock();
    /* Releases every level the calling thread holds; returns how many. */
    unsigned release_all();
    /* Takes the lock back at DEPTH levels. */
    void reacquire(unsigned depth);
    /* Whether another thread waits for the lock now. */
    bool contended() const { return waiting_.load(std::memory_order_relaxed) > 0; }
    /* Lets the threads waiting for the lock in, then takes it back; the
     * caller has closed the device memory it had open. */
    void yield_to_waiters();

private:
    std::mutex m_;
    std::atomic<std::thread::id> owner_{};
    unsigned depth_ = 0;          /* levels the owner holds; the owner's */
    std::atomic<int> waiting_{0}; /* threads blocked in lock() or reacquire() */
};

extern emu_mutex emu_lock;

/* ---- reports (streams.cc) -------------------------------------------------------- */

/* Prints a problem in CUDA code once per distinct text and counts it. */
void problem(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The seeded generator that orders warps, blocks and streams
 * (CUDAEMU_SEED; 0 or unset picks 1). */
uint64_t rng(void);
/* Sets the calling thread's last error (and returns E); a sticky error
 * poisons every later call of the process, as a real context does. */
cudaError_t set_error(cudaError_t e);
cudaError_t set_sticky(cudaError_t e);
cudaError_t sticky_error(void);
/* The calling thread's current device (cudaSetDevice). */
int current_device(void);

/* ---- device memory (memory.cc) --------------------------------------------------- */

void mem_init(void);
void install_fault_handler(void);
/* Device memory becomes readable and writable for device work (open) and
 * PROT_NONE again for host code (close).  Calls nest. */
void mem_open(void);
void mem_close(void);
/* Opens (and closes) only the allocation or IPC mapping holding [P, P+N),
 * if device memory is closed: a copy or memset touches nothing else, and
 * without protection keys opening every allocation costs page-table work
 * in proportion to all of them.  Host memory is left alone.  Calls pair. */
void mem_open_range(const void *p, size_t n);
void mem_close_range(const void *p, size_t n);
/* Whether [P, P+N) lies inside one live allocation or IPC mapping. */
bool mem_is_device(const void *p, size_t n);
/* Whether P is the first byte of a live allocation of this process; its
 * size in *N. */
bool mem_alloc_base(const void *p, size_t *n);
/* The span of P in its allocation, for reports: "allocation of N bytes at
 * B + off". */
std::string mem_describe(const void *p);

/* ---- streams (streams.cc) -------------------------------------------------------- */

/* Queues FN on STREAM as one in-order command, or records it into the
 * graph STREAM is capturing.  WHAT names it in reports. */
cudaError_t stream_enqueue(cudaStream_t stream, const char *what, std::function<void()> fn);
/* A command that may have to wait for another process (an NCCL
 * collective): POLL_WAIT leaves it at the head of its stream, and the
 * scheduler runs other streams or sleeps before polling it again.  A wait
 * longer than CUDAEMU_NCCL_TIMEOUT seconds is a problem. */
enum poll_result { POLL_DONE, POLL_WAIT };
/* CUDAEMU_NCCL_TIMEOUT (60 s by default), and a monotonic clock. */
double wait_limit_s(void);
double seconds_now(void);
cudaError_t stream_enqueue_polled(cudaStream_t stream, const char *what,
                                  std::function<poll_result()> poll);
/* Whether the calling thread may make a call that is unsafe during a
 * capture (a synchronous copy, a device-wide sync, cudaMalloc); when not,
 * the capture is invalidated and the error returned. */
cudaError_t capture_check_unsafe(const char *api);

/* ---- kernels (exec.cc) ---------------------------------------------------------- */

struct kernel_launch {
    const char *name;
    const char *file;
    int line;
    const void *fn;
    launch_cfg cfg;
    std::shared_ptr<const kernel_call> call;
};

/* Checks a launch's configuration against the sm_90 limits (and the
 * function's shared-memory attribute); 0 or the CUDA error. */
cudaError_t exec_check(const kernel_launch &k);
/* Runs every block of K (device memory open); false when the launch failed
 * (a problem or a fault), after setting the sticky error. */
bool exec_run(const kernel_launch &k);
void exec_set_max_dyn_smem(const void *fn, int bytes);
/* From the SIGSEGV handler: false when no kernel runs; else reports the
 * fault and jumps back into exec_run (the launch fails), or returns true in
 * a sanitizer build, where the process must die of it. */
bool exec_on_fault(void *addr);

} /* namespace cudaemu */

#endif
