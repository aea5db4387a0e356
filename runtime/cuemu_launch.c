/* cuemu_launch.c — the CUDA emulation's kernels: libraries, kernel handles
 * and launches (cudaLibraryLoadData / GetKernel / Unload,
 * cudaFuncGetAttributes / SetAttribute, cudaLaunchKernel), over the
 * registry of named kernel tables (cuemu_kernel.h).
 *
 * An emulated image is the text "cuemu:NAME": the library is that one
 * table ("kernels/cuda", cuemu_kc.cc, is registered on the first load;
 * others by cuemu_kernels_add), as a cubin is one module, and
 * cudaLibraryGetKernel finds a name in it alone: a kernel looked up in
 * another library is not found, as on a GPU.  A kernel handle works while
 * a library of its table is loaded (unloaded: refused, as the driver
 * refuses a kernel of an unloaded library).  PTX or a cubin is refused
 * with one line (cudaErrorInvalidKernelImage): the emulation runs host
 * code only.
 *
 * cudaLaunchKernel checks what a GPU would refuse or fault on: the handle
 * is a registered kernel, the geometry is one-dimensional (all fsdpc
 * launches) with 1 to 1024 threads, the dynamic shared memory is within
 * the kernel's limit (48 KiB, raised to at most 227 KiB by
 * cudaFuncSetAttribute), and every pointer argument is NULL or points into
 * a device allocation (a host pointer handed to a kernel is named, with
 * the kernel and the argument).  It then copies the arguments (CUDA's
 * semantics: the caller's variables may change right after) and enqueues
 * the run on the stream, or records it into a capture.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuemu.h"

#define MAX_TABLES 64
#define SMEM_DEFAULT (48 << 10)
#define SMEM_OPTIN (227 << 10)

typedef struct {
    const char *name;
    const CuemuKernel *k;
    int n;
    int *smem;           /* n limits of dynamic shared memory */
    int loaded;          /* libraries of this table loaded now */
} Table;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static Table g_table[MAX_TABLES];
static int g_ntable;

struct CUlib_st {
    int table;           /* its index into g_table */
};

/* adds a table (g_mu held) */
static int add_locked(const char *name, const CuemuKernel *t, int n)
{
    if (g_ntable == MAX_TABLES || n < 0)
        return -1;
    int *smem = malloc((size_t)(n ? n : 1) * sizeof *smem);
    if (!smem)
        return -1;
    for (int i = 0; i < n; i++)
        smem[i] = SMEM_DEFAULT;
    g_table[g_ntable++] = (Table){name, t, n, smem, 0};
    return 0;
}

static int find_table(const char *name, size_t len)
{
    for (int i = 0; i < g_ntable; i++)
        if (strlen(g_table[i].name) == len && !strncmp(g_table[i].name, name, len))
            return i;
    return -1;
}

int cuemu_kernels_add(const char *name, const CuemuKernel *t, int n)
{
    pthread_mutex_lock(&g_mu);
    int r = find_table(name, strlen(name)) >= 0 ? -1 : add_locked(name, t, n);
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* the limit slot of kernel k of a loaded table, or NULL (g_mu held) */
static int *smem_of(const CuemuKernel *k)
{
    for (int i = 0; i < g_ntable; i++)
        if (g_table[i].loaded > 0 && k >= g_table[i].k && k < g_table[i].k + g_table[i].n)
            return &g_table[i].smem[k - g_table[i].k];
    return NULL;
}

cudaError_t cudaLibraryLoadData(cudaLibrary_t *plib, const void *code, enum cudaJitOption *jo, void **jv,
                                unsigned njo, enum cudaLibraryOption *lo, void **lv, unsigned nlo)
{
    (void)jo, (void)jv, (void)njo, (void)lo, (void)lv, (void)nlo;
    if (!plib || !code)
        return cuemu_fail(cudaErrorInvalidValue);
    *plib = NULL;
    if (strncmp(code, "cuemu:", 6) != 0) {
        cuemu_complain("cudaLibraryLoadData", "the image is GPU code (PTX or a cubin), not an emulated image "
                                              "(\"cuemu:TABLE\"): the emulation runs host code only");
        return cuemu_fail(cudaErrorInvalidKernelImage);
    }
    struct CUlib_st *lib = calloc(1, sizeof *lib);
    if (!lib)
        return cuemu_fail(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&g_mu);
    int r = 0;
    if (find_table("kernels/cuda", 12) < 0)
        r = add_locked("kernels/cuda", cuemu_kc_kernels, cuemu_kc_nkernels);
    const char *name = (const char *)code + 6; /* past "cuemu:" */
    lib->table = find_table(name, strlen(name));
    if (r == 0 && lib->table < 0) {
        cuemu_complain("cudaLibraryLoadData", "the image names kernel table '%s', which is not registered", name);
        r = -1;
    }
    if (r == 0)
        g_table[lib->table].loaded++;
    pthread_mutex_unlock(&g_mu);
    if (r != 0) {
        free(lib);
        return cuemu_fail(cudaErrorInvalidKernelImage);
    }
    *plib = lib;
    return cudaSuccess;
}

cudaError_t cudaLibraryGetKernel(cudaKernel_t *pk, cudaLibrary_t lib, const char *name)
{
    if (!pk || !lib || !name)
        return cuemu_fail(cudaErrorInvalidValue);
    *pk = NULL;
    pthread_mutex_lock(&g_mu);
    const Table *t = &g_table[lib->table];
    for (int k = 0; k < t->n && !*pk; k++)
        if (!strcmp(t->k[k].name, name))
            *pk = (cudaKernel_t)&t->k[k];
    pthread_mutex_unlock(&g_mu);
    return *pk ? cudaSuccess : cuemu_fail(cudaErrorSymbolNotFound);
}

cudaError_t cudaLibraryUnload(cudaLibrary_t lib)
{
    if (!lib)
        return cuemu_fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&g_mu);
    g_table[lib->table].loaded--;
    pthread_mutex_unlock(&g_mu);
    free(lib);
    return cudaSuccess;
}

/* the registered kernel behind func, or NULL after a message naming call */
static const CuemuKernel *kernel_of(const void *func, const char *call, int **smem)
{
    pthread_mutex_lock(&g_mu);
    *smem = smem_of(func);
    pthread_mutex_unlock(&g_mu);
    if (!*smem)
        cuemu_complain(call, "%p is not a kernel of a loaded library", func);
    return *smem ? func : NULL;
}

cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *a, const void *func)
{
    int *smem;
    if (!a || !kernel_of(func, "cudaFuncGetAttributes", &smem))
        return cuemu_fail(cudaErrorInvalidDeviceFunction);
    memset(a, 0, sizeof *a);
    a->maxThreadsPerBlock = 1024;
    a->numRegs = 32;
    a->ptxVersion = a->binaryVersion = 90;
    a->maxDynamicSharedSizeBytes = *smem;
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    int *smem;
    if (!kernel_of(func, "cudaFuncSetAttribute", &smem))
        return cuemu_fail(cudaErrorInvalidDeviceFunction);
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
        return cudaSuccess; /* the others change nothing on the host */
    if (value < 0 || value > SMEM_OPTIN)
        return cuemu_fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&g_mu);
    *smem = value;
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

/* a launch's copied arguments: the header, then each argument at off[i] */
typedef struct {
    const CuemuKernel *k;
    unsigned grid, block, smem;
    size_t off[CUEMU_MAX_ARGS];
} Launch;

static void run_launch(void *p)
{
    Launch *l = p;
    void *args[CUEMU_MAX_ARGS];
    for (int i = 0; i < l->k->nargs; i++)
        args[i] = (char *)p + l->off[i];
    l->k->run(args, l->grid, l->block, l->smem);
}

/* every pointer argument is NULL or device memory; 0 or -1 after a message */
static int check_args(const CuemuKernel *k, void **args)
{
    for (int i = 0; i < k->nargs; i++) {
        if (!k->is_ptr[i])
            continue;
        void *p;
        memcpy(&p, args[i], sizeof p);
        if (p && !cuemu_is_device(p, 0)) {
            cuemu_complain("cudaLaunchKernel", "kernel %s: argument %d (%p) is not device memory", k->name, i, p);
            return -1;
        }
    }
    return 0;
}

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t smem, cudaStream_t s)
{
    int *limit;
    const CuemuKernel *k = kernel_of(func, "cudaLaunchKernel", &limit);
    if (!k)
        return cuemu_fail(cudaErrorInvalidDeviceFunction);
    if (grid.x < 1 || grid.x > 0x7fffffffu || grid.y != 1 || grid.z != 1 || block.x < 1 || block.x > 1024 ||
        block.y != 1 || block.z != 1) {
        cuemu_complain("cudaLaunchKernel", "kernel %s: grid %ux%ux%u, block %ux%ux%u (one dimension, 1 to 1024 "
                                           "threads, are emulated)", k->name, grid.x, grid.y, grid.z, block.x,
                       block.y, block.z);
        return cuemu_fail(cudaErrorInvalidConfiguration);
    }
    if (smem > (size_t)*limit) {
        cuemu_complain("cudaLaunchKernel", "kernel %s: %zu bytes of dynamic shared memory, above its limit %d",
                       k->name, smem, *limit);
        return cuemu_fail(cudaErrorInvalidValue);
    }
    if (k->nargs > CUEMU_MAX_ARGS || (k->nargs && !args) || check_args(k, args) != 0)
        return cuemu_fail(cudaErrorInvalidValue);
    Launch head = {k, grid.x, block.x, (unsigned)smem, {0}};
    size_t total = sizeof head;
    for (int i = 0; i < k->nargs; i++) {
        total = (total + 15) / 16 * 16;
        head.off[i] = total;
        total += k->size[i];
    }
    char *block_ = malloc(total);
    if (!block_)
        return cuemu_fail(cudaErrorMemoryAllocation);
    memcpy(block_, &head, sizeof head);
    for (int i = 0; i < k->nargs; i++)
        memcpy(block_ + head.off[i], args[i], k->size[i]);
    cudaError_t e = cuemu_enqueue(s, "cudaLaunchKernel", run_launch, block_, total);
    free(block_);
    return e;
}
