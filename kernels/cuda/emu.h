/* emu.h — just enough of CUDA, on the host, to run the kernels of
 * kernels/cuda as plain C++: for the emulated runtime's kernels
 * (runtime/cuemu_kc.cc, linked in place of the GPU, and into
 * tests/kernels_cuda_test.cc's program).
 *
 * How it works.  A launch runs its blocks one after another; a block runs
 * its blockDim.x threads as fibers on the calling OS thread (each fiber
 * made once and reused by later blocks and launches; switched by a few
 * instructions on x86-64, by ucontext elsewhere).  A
 * scheduler resumes the runnable fibers round-robin, each until it finishes
 * or waits at a barrier:
 *   __syncthreads()        waits until every thread of the block arrived;
 *   __shfl_*_sync          each lane writes its value into a per-thread
 *                          exchange slot, waits for its warp, reads its
 *                          source lane's slot, waits again;
 * so the block behaves as if its threads ran concurrently, and a thread
 * that races ahead of a missing barrier reads what the others have not
 * written yet.  If a round makes no progress while threads are waiting (a
 * barrier some threads never reach, or reach after exiting), the launch
 * aborts with a message: on a GPU that is a hang or undefined behaviour.
 * Shuffles demand a full mask and a full warp, as the kernels promise.
 *
 * threadIdx, blockIdx, blockDim and gridDim are globals the scheduler sets
 * before resuming a fiber.  __shared__ is `static`: one copy per kernel (or
 * per template instance), which is right because blocks never overlap (and
 * wrong values left by the previous block are what a GPU leaves too).
 * All of that state is thread_local, __shared__ included (`static
 * thread_local`): the fibers of a launch run on the OS thread that called
 * run(), so two launches on two threads (the emulated runtime's streams,
 * one worker thread each) run at once without sharing anything but the
 * memory they are given, as two kernels on two streams of a GPU do.
 * __device__, __global__ and __forceinline__ go away; atomics use
 * std::atomic_ref; the math functions are libm's.  KC_GLOBAL is empty, so
 * the kernels are ordinary functions: the includer puts the sources inside
 * a namespace, away from the kernels/c functions of the same names.
 * run_args() runs a kernel from cudaLaunchKernel's argument array, each
 * argument copied into a value of its parameter's type.  One launch is
 * single-threaded, so its results are deterministic.  The
 * tensor cores' nvcuda::wmma calls the kernels use are emulated at the end.
 */
#ifndef FSDPC_KC_EMU_H
#define FSDPC_KC_EMU_H

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <math.h>
#include <stdint.h>
#include <sys/mman.h>
#include <ucontext.h>
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/common_interface_defs.h>
#endif

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
constexpr int warpSize = 32;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static thread_local
#define __align__(n) __attribute__((aligned(n)))
#define KC_GLOBAL

namespace emu {

constexpr size_t kStack = 64 << 10; /* per fiber, plus a guard page */

/* How a fiber's context is switched.  On x86-64 (without ASan) a saved
 * context is a stack pointer: switch_stack pushes the callee-saved
 * registers, stores the stack pointer, loads the other one and pops its
 * registers — no system call, where swapcontext masks signals twice per
 * switch (most of an emulated run's time went there).  Under ASan each
 * switch is announced to it (__sanitizer_start/finish_switch_fiber, as its
 * swapcontext interceptor would learn it), with the stack switched to: a
 * fiber's own, or the scheduler's, which a fiber learns when first entered.
 * Elsewhere, and where FSDPC_EMU_UCONTEXT is defined (to test them), the
 * ucontext calls.  The float environment (MXCSR, x87 control word) is not
 * switched: every fiber of a launch shares its OS thread's, and kernels do
 * not change it. */
#if defined(__x86_64__) && !defined(FSDPC_EMU_UCONTEXT)
#define FSDPC_EMU_FAST_SWITCH 1
/* saves the current context into *save, resumes the one at load */
[[maybe_unused]] __attribute__((naked, noinline)) static void switch_stack(void ** /* save: rdi */,
                                                                           void * /* load: rsi */)
{
    __asm__ volatile("pushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n\t"
                     "movq %rsp, (%rdi)\n\tmovq %rsi, %rsp\n\t"
                     "popq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n\tret\n\t");
}
struct Context {
    void *sp = nullptr;
    const void *stack = nullptr; /* the stack's lowest byte and size (for ASan) */
    size_t size = 0;
};
#else
#define FSDPC_EMU_FAST_SWITCH 0
struct Context {
    ucontext_t uc;
};
#endif

struct Fiber {
    Context ctx;
    bool done;
    const unsigned *wait_on; /* a generation counter this fiber waits to change */
    unsigned wait_seen;
};

struct State {
    std::vector<Fiber> fiber; /* one per stack: a fiber outlives its block, running the next block's thread */
    std::vector<char *> stack;
    std::vector<unsigned> warp_arrived, warp_gen;
    std::vector<uint64_t> xchg; /* one shuffle slot per thread */
    unsigned arrived = 0, gen = 0;
    Fiber *cur = nullptr;
    Context sched;
    const std::function<void()> *body = nullptr;
    const char *kernel = "?";
    long launches = 0, blocks = 0, threads = 0;
};
inline thread_local State st;

/* saves the current context into from and resumes to */
inline void switch_to(Context &from, Context &to)
{
#if FSDPC_EMU_FAST_SWITCH && defined(__SANITIZE_ADDRESS__)
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, to.stack, to.size);
    switch_stack(&from.sp, to.sp);
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#elif FSDPC_EMU_FAST_SWITCH
    switch_stack(&from.sp, to.sp);
#else
    swapcontext(&from.uc, &to.uc);
#endif
}

[[noreturn]] inline void fail(const char *msg)
{
    fprintf(stderr, "kernels/cuda/emu.h: kernel %s, block %u, thread %u: %s\n", st.kernel, blockIdx.x, threadIdx.x,
            msg);
    abort();
}

inline char *stack_for(size_t i)
{
    while (st.stack.size() <= i) {
        const size_t page = 4096;
        void *p = mmap(nullptr, kStack + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            fail("cannot map a fiber stack");
        mprotect(p, page, PROT_NONE); /* the stack grows down into the guard */
        st.stack.push_back((char *)p + page);
    }
    return st.stack[i];
}

/* a fiber's life: run the thread body of the block it is resumed for, then
 * back to the scheduler, done, until resumed for the next block */
inline void fiber_main()
{
#if FSDPC_EMU_FAST_SWITCH && defined(__SANITIZE_ADDRESS__)
    /* entered from the scheduler (run_block) for the first time: ASan names its stack */
    __sanitizer_finish_switch_fiber(nullptr, &st.sched.stack, &st.sched.size);
#endif
    for (;;) {
        (*st.body)();
        st.cur->done = true;
        switch_to(st.cur->ctx, st.sched);
    }
}

/* fiber i's context at the start of fiber_main on its own stack */
inline void fiber_init(Fiber &f, size_t i)
{
    char *base = stack_for(i);
#if FSDPC_EMU_FAST_SWITCH
    /* what switch_stack pops: six registers, then fiber_main as the return
     * address, above it a null return address of fiber_main's own (it
     * never returns), so that fiber_main starts as if called: rsp = 8 mod 16 */
    void **top = (void **)(base + kStack), **sp = top - 8;
    memset(sp, 0, 8 * sizeof *sp);
    sp[6] = (void *)fiber_main;
    f.ctx.sp = sp;
    f.ctx.stack = base;
    f.ctx.size = kStack;
#else
    getcontext(&f.ctx.uc);
    f.ctx.uc.uc_stack.ss_sp = base;
    f.ctx.uc.uc_stack.ss_size = kStack;
    f.ctx.uc.uc_link = nullptr; /* fiber_main never returns */
    makecontext(&f.ctx.uc, fiber_main, 0);
#endif
}

/* the current fiber waits until *gen differs from seen */
inline void wait_change(const unsigned *gen, unsigned seen)
{
    st.cur->wait_on = gen;
    st.cur->wait_seen = seen;
    switch_to(st.cur->ctx, st.sched);
}

/* Runs one block of blockDim.x fibers to completion: the fibers of earlier
 * blocks (each back in fiber_main's loop) first, new ones for the rest. */
inline void run_block()
{
    const unsigned n = blockDim.x, warps = (n + 31) / 32;
    st.fiber.reserve(1024); /* never moved: a suspended ucontext_t points into itself */
    for (size_t t = st.fiber.size(); t < n; t++) {
        st.fiber.emplace_back();
        fiber_init(st.fiber.back(), t);
    }
    st.warp_arrived.assign(warps, 0);
    st.warp_gen.assign(warps, 0);
    st.xchg.assign(n, 0);
    st.arrived = 0;
    for (unsigned t = 0; t < n; t++) {
        st.fiber[t].done = false;
        st.fiber[t].wait_on = nullptr;
    }
    for (;;) {
        bool progress = false, all_done = true;
        for (unsigned t = 0; t < n; t++) {
            Fiber &f = st.fiber[t];
            if (f.done)
                continue;
            all_done = false;
            if (f.wait_on && *f.wait_on == f.wait_seen)
                continue;
            f.wait_on = nullptr;
            st.cur = &f;
            threadIdx.x = t;
            switch_to(st.sched, f.ctx);
            progress = true;
        }
        if (all_done)
            return;
        if (!progress)
            fail("deadlock: a barrier that not every thread of the block reaches");
    }
}

/* Runs body for every thread of a grid x block launch. */
inline void run(const char *kernel, unsigned grid, unsigned block, const std::function<void()> &body)
{
    st.kernel = kernel;
    if (grid < 1 || block < 1 || block > 1024)
        fail("bad launch geometry");
    st.body = &body;
    gridDim.x = grid;
    blockDim.x = block;
    st.launches++;
    for (unsigned b = 0; b < grid; b++) {
        blockIdx.x = b;
        run_block();
    }
    st.blocks += grid;
    st.threads += (long)grid * block;
}

/* Copies each args[i] into a value of fn's parameter type i (as
 * cudaLaunchKernel does) and runs the grid. */
template <typename... P, size_t... I>
void run_unpacked(const char *name, void (*fn)(P...), unsigned grid, unsigned block, void *const *args,
                  std::index_sequence<I...>)
{
    std::tuple<std::decay_t<P>...> vals;
    (memcpy((void *)&std::get<I>(vals), args[I], sizeof(std::get<I>(vals))), ...);
    run(name, grid, block, [&] { std::apply(fn, vals); });
}

template <typename... P> void run_args(const char *name, void (*fn)(P...), unsigned grid, unsigned block, void *const *args)
{
    run_unpacked(name, fn, grid, block, args, std::index_sequence_for<P...>{});
}

/* the sizes and pointer flags of a kernel's parameter list void(P...), for
 * the emulated runtime's kernel tables (runtime/cuemu_kernel.h) */
template <typename F> struct Params;
template <typename... P> struct Params<void(P...)> {
    static constexpr int n = sizeof...(P);
    static constexpr size_t size[sizeof...(P) + 1] = {sizeof(P)..., 0};
    static constexpr unsigned char is_ptr[sizeof...(P) + 1] = {(unsigned char)std::is_pointer_v<P>..., 0};
};

inline void sync_block()
{
    const unsigned seen = st.gen;
    if (++st.arrived == blockDim.x) { /* the last one releases the others */
        st.arrived = 0;
        st.gen++;
        return;
    }
    wait_change(&st.gen, seen);
}

inline void sync_warp()
{
    const unsigned w = threadIdx.x / 32, size = std::min(32u, blockDim.x - w * 32);
    const unsigned seen = st.warp_gen[w];
    if (++st.warp_arrived[w] == size) {
        st.warp_arrived[w] = 0;
        st.warp_gen[w]++;
        return;
    }
    wait_change(&st.warp_gen[w], seen);
}

/* value of lane src of this thread's warp (every lane calls it) */
template <typename T> T shuffle(unsigned mask, T v, unsigned src)
{
    static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
    const unsigned base = threadIdx.x & ~31u;
    if (mask != 0xffffffffu || base + 32 > blockDim.x)
        fail("shuffle without a full mask and a full warp");
    uint64_t slot = 0;
    memcpy(&slot, &v, sizeof v);
    st.xchg[threadIdx.x] = slot;
    sync_warp();
    T r;
    memcpy(&r, &st.xchg[base + src], sizeof r);
    sync_warp();
    return r;
}

} // namespace emu

inline void __syncthreads() { emu::sync_block(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::sync_warp(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

template <typename T> T __shfl_xor_sync(unsigned mask, T v, int lanemask)
{
    return emu::shuffle(mask, v, (threadIdx.x & 31u) ^ (unsigned)lanemask);
}
template <typename T> T __shfl_down_sync(unsigned mask, T v, unsigned delta)
{
    const unsigned lane = threadIdx.x & 31u;
    return emu::shuffle(mask, v, lane + delta < 32 ? lane + delta : lane);
}
template <typename T> T __shfl_sync(unsigned mask, T v, int src)
{
    return emu::shuffle(mask, v, (unsigned)src & 31u);
}

inline unsigned atomicAdd(unsigned *p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline unsigned long long atomicMin(unsigned long long *p, unsigned long long v)
{
    std::atomic_ref<unsigned long long> a(*p);
    unsigned long long old = a.load();
    while (v < old && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}

inline float __int_as_float(int v)
{
    float f;
    memcpy(&f, &v, sizeof f);
    return f;
}
inline unsigned __float_as_uint(float v)
{
    unsigned u;
    memcpy(&u, &v, sizeof u);
    return u;
}
inline float __uint_as_float(unsigned u)
{
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}
inline double __longlong_as_double(long long v)
{
    double d;
    memcpy(&d, &v, sizeof d);
    return d;
}
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }

/* ---- tensor cores: the subset of nvcuda::wmma (mma.h) the kernels use ------
 * 16 x 16 x 16 fragments of bfloat16 / float16 operands and a float
 * accumulator.  A fragment holds its whole tile (as floats: every 16-bit
 * value is one) in every thread of the warp; each call is one warp-wide
 * step (every lane must make it, as on the GPU: a barrier of the warp) that
 * every lane performs alike, so a store writes the same values once per
 * lane.  Pointers must be 32-byte aligned and ldm a multiple of 16 bytes,
 * as the hardware demands; the products sum k in order in float. */
struct __nv_bfloat16 {
    uint16_t bits;
};
struct __half {
    uint16_t bits;
};

namespace emu {
inline float wide(__nv_bfloat16 h)
{
    const uint32_t u = (uint32_t)h.bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
inline float wide(__half h) /* exact: every float16 is a float */
{
    const int e = (h.bits >> 10) & 0x1f, m = h.bits & 0x3ff;
    const float v = e == 0x1f ? (m ? NAN : INFINITY) : e ? ldexpf((float)(m | 0x400), e - 25) : ldexpf((float)m, -24);
    return h.bits & 0x8000 ? -v : v;
}
inline float wide(float f) { return f; }

inline void wmma_check(const void *p, unsigned ldm, size_t esize)
{
    if ((uintptr_t)p % 32 || ldm * esize % 16)
        fail("wmma: a pointer not 32-byte aligned or an ldm not a multiple of 16 bytes");
}
} // namespace emu

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static constexpr int rows = std::is_same_v<Use, matrix_b> ? K : M;
    static constexpr int cols = std::is_same_v<Use, matrix_a> ? K : N;
    float x[rows * cols]; /* (r, c) at x[r cols + c] */
};

template <typename Use, int M, int N, int K, typename T, typename Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout> &f, const T *p, unsigned ldm)
{
    static_assert(!std::is_same_v<Layout, void>, "load_matrix_sync: an operand fragment needs a layout");
    emu::sync_warp();
    emu::wmma_check(p, ldm, sizeof(T));
    typedef fragment<Use, M, N, K, T, Layout> F;
    for (int r = 0; r < F::rows; r++)
        for (int c = 0; c < F::cols; c++)
            f.x[r * F::cols + c] = emu::wide(std::is_same_v<Layout, row_major> ? p[r * ldm + c] : p[c * ldm + r]);
}

template <int M, int N, int K, typename T>
void store_matrix_sync(T *p, const fragment<accumulator, M, N, K, T> &f, unsigned ldm, layout_t l)
{
    emu::sync_warp();
    emu::wmma_check(p, ldm, sizeof(T));
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++)
            p[l == mem_row_major ? r * ldm + c : c * ldm + r] = f.x[r * N + c];
}

template <int M, int N, int K, typename T> void fill_fragment(fragment<accumulator, M, N, K, T> &f, T v)
{
    emu::sync_warp();
    for (float &e : f.x)
        e = v;
}

template <int M, int N, int K, typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, M, N, K, float> &d, const fragment<matrix_a, M, N, K, T, LA> &a,
              const fragment<matrix_b, M, N, K, T, LB> &b, const fragment<accumulator, M, N, K, float> &c)
{
    emu::sync_warp();
    float r[M * N];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = c.x[i * N + j];
            for (int k = 0; k < K; k++)
                s += a.x[i * K + k] * b.x[k * N + j];
            r[i * N + j] = s;
        }
    memcpy(d.x, r, sizeof r);
}
} // namespace wmma
} // namespace nvcuda

#endif
