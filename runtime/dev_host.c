/* dev_host.c — the device layer of the cpu target (rt_dev.h): the step runs
 * on the host allocation itself, so there is nothing to pick, copy or free;
 * and the step's byte copies and fills (rt.h) are memcpy and memset.
 */
#include <string.h>

#include "rt_dev.h"

int rt_dev_init(const RtModel *m, int rank, int world, int64_t bytes, char *err, size_t errlen)
{
    (void)m, (void)rank, (void)world, (void)bytes, (void)err, (void)errlen;
    return 0;
}

void rt_dev_set_graph(int use_graph) { (void)use_graph; }

int rt_dev_attach(RtCtx *c, char *base, int64_t bytes, char *err, size_t errlen)
{
    (void)base, (void)bytes, (void)err, (void)errlen;
    c->dev_arena = c->arena;
    c->dev_slot = c->slot;
    c->dev_shard = c->shard;
    return 0;
}

void rt_dev_upload(RtCtx *c, const void *p, int64_t n) { (void)c, (void)p, (void)n; }

void rt_dev_download(RtCtx *c, void *p, int64_t n) { (void)c, (void)p, (void)n; }

void rt_dev_step(RtCtx *c) { c->m->step(c); }

void rt_dev_finish(RtCtx *c) { (void)c; }

void rt_memcpy(void *dst, const void *src, int64_t bytes)
{
    if (bytes > 0)
        memcpy(dst, src, (size_t)bytes);
}

void rt_memset(void *dst, int byte, int64_t bytes)
{
    if (bytes > 0)
        memset(dst, byte, (size_t)bytes);
}
