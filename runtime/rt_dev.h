/* rt_dev.h — where the step's memory lives.  Private to runtime/.
 *
 * The runtime always carves its one allocation in host memory (rt_carve)
 * and does all of its host work there: loading the init file, writing each
 * batch, reading the loss, exporting.  On the cpu target that memory is
 * what the step runs on and every function below is (nearly) a no-op
 * (dev_host.c).  On the cuda target (dev_cuda.c) the host allocation is a
 * mirror: rt_dev_init picks the device and checks that the plan fits,
 * rt_dev_attach allocates the same layout in device memory and points
 * c->dev_arena / dev_slot / dev_shard at it, and the copies below move
 * regions between the two.  The generated step only ever sees the dev_
 * pointers.
 *
 * Where the core (rt.c, load.c, eval.c, export.c) calls them: rt_dev_init
 * after the flags and rt_ctl_init, before carving (its failure is a
 * start-up error agreed on by all ranks); rt_dev_set_graph then;
 * rt_dev_attach once the init file is loaded; rt_dev_upload of every input
 * after each batch is written (and of eval inputs); rt_dev_step for every
 * step; rt_dev_download of the loss after each step, of the gradient shards
 * (--dump-grads) and parameter shards and written-back constants (export)
 * before they are read, and of eval outputs; rt_dev_finish at the end.
 */
#ifndef FSDPC_RT_DEV_H
#define FSDPC_RT_DEV_H

#include <stddef.h>
#include <stdint.h>

#include "rt.h"

/* First thing in main, before the control plane starts MPI: where the
 * step's threads would wait by spinning on cores that other threads need
 * (cpu: dev_host.c's wait policy), the process may set the environment
 * the threading libraries read when they load and exec itself again with
 * argv; a no-op on cuda. */
void rt_dev_preinit(char **argv);
/* Before carving: pick this rank's device (local rank modulo the devices),
 * create streams and handles, and check that `bytes` of device memory are
 * free.  0, or -1 with a one-line reason in err ("no CUDA driver", "no CUDA
 * device", "needs X GiB, Y free", "built for sm_90, device is sm_80", ...). */
int rt_dev_init(const RtModel *m, int rank, int world, int64_t bytes, char *err, size_t errlen);
/* After rt_dev_init succeeded on every rank (a collective): what every rank
 * must compute alike is rank 0's (cpu: the float32 GEMMs' library); a no-op
 * on cuda. */
void rt_dev_agree(RtCtx *c);
/* --no-cuda-graph: run every step eagerly (call before rt_dev_attach) */
void rt_dev_set_graph(int use_graph);
/* After carving: the device copy of c->arena .. c->shard (same offsets),
 * c->dev_* set, the whole host allocation [base, base + bytes) uploaded.
 * 0, or -1 with a reason in err. */
int rt_dev_attach(RtCtx *c, char *base, int64_t bytes, char *err, size_t errlen);
/* host region [p, p + n) of the carved allocation to its device twin, and back */
void rt_dev_upload(RtCtx *c, const void *p, int64_t n);
void rt_dev_download(RtCtx *c, void *p, int64_t n);
/* one step (training, or eval's forward pass): m->step on the device (after
 * warm-up, a CUDA Graph replay unless disabled), then the checks of the
 * step; returns when the loss can be read (after rt_dev_download of it) */
void rt_dev_step(RtCtx *c);
/* how the step's collectives run beside it (for the start-up report); on cpu
 * this decides whether rt_coll_start hands them to a communication thread
 * (dev_host.c).  After rt_dev_attach, on every rank. */
const char *rt_dev_overlap(RtCtx *c);
/* the threads the step computes on, and why ("" where the device has none to say: cuda); after rt_dev_init */
const char *rt_dev_threads(void);
/* cpu only (dev_host.c): will the communication thread run at world (1), or the collectives inside the step (0)? */
int rt_dev_comm_thread(int world);
/* the GEMM peak of this rank's device in FLOP/s, measured once (cpu: k_matmul_f32 on the BLAS threads the
 * run has, over the CPU time they got; bf16: k_matmul_bf16 instead, for a step whose GEMMs run oneDNN's
 * native bf16 GEMM, about twice float32's rate); *share: the fraction of its threads' time the probe got (1:
 * a quiet machine; -1: not measured); 0 where it is not measured (cuda: --peak-tflops gives it) */
double rt_dev_peak_flops(int bf16, double *share);
/* release what rt_dev_init / rt_dev_attach made; called once at the end of
 * every run past its flags, whatever part of start-up it reached (also when
 * rt_dev_init failed or was never called) */
void rt_dev_finish(RtCtx *c);

#endif
