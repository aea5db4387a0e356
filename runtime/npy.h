/* npy.h — private to runtime/: a strict reader of NumPy .npy files, and a
 * writer (format 1.0, atomic).
 *
 * Files are untrusted: the header is parsed with bounds checks on every byte,
 * the shape is checked for overflow and the data size against the file size.
 * Supported dtypes: '<f4' '<f8' '<f2' '|b1' and the integers '|i1' '|u1' '<i2' '<u2' '<i4' '<u4' '<i8' '<u8'
 * (RT_* codes but RT_BF16);
 * reader is tested standalone (tests/rt_npy_test.c).
 */
#ifndef FSDPC_NPY_H
#define FSDPC_NPY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "afile.h"
#include "rt.h"

typedef struct {
    int dtype;                  /* an RT_* code */
    int rank;                   /* 0 for a scalar "()" */
    int64_t shape[RT_MAX_RANK];
    int64_t numel;              /* product of shape (1 for a scalar) */
    const char *data;           /* numel * elem size bytes */
    size_t nbytes;
    int major, minor;           /* format version */
    /* owned by npy_open */
    void *map;
    size_t map_len;
    char *path;                 /* the file's (for messages) */
} NpyArray;

/* Parse a whole .npy image held in memory (buf, len).  On success fills *a
 * (a->data points into buf) and returns 0; on failure writes a one-line
 * reason (without the file name) to err and returns -1. */
int npy_parse(const void *buf, size_t len, NpyArray *a, char *err, size_t errlen);

/* Map PATH read-only and parse it.  On failure writes "PATH: reason" to err
 * and returns -1 (nothing to close).  On success the caller owns a mapping
 * released by npy_close. */
int npy_open(const char *path, NpyArray *a, char *err, size_t errlen);
void npy_close(NpyArray *a);

/* A mapped file that shrinks under the run (truncated, rewritten in place) raises SIGBUS where a read
 * touches a page past its new end.  Reads of mapped data run between RT_MAP_TRY(jb) and rt_map_guard_end()
 * on one thread: RT_MAP_TRY is 0 on entry, and 1 again after such a fault, with rt_map_fault() the address
 * the read touched (the caller names the file holding it, and stops: one line, never the signal).  The
 * handler is installed once, by rt_map_guard_install (after MPI_Init, so that a SIGBUS outside a guarded
 * read still goes to the handler that was there: MPI's, or the default).  Measured beside pread per row:
 * see runtime/npy.c. */
int rt_map_guard_install(void);
void rt_map_guard_begin(void *jb); /* a sigjmp_buf: void here, for files without POSIX's setjmp.h */
void rt_map_guard_end(void);
const void *rt_map_fault(void);
#define RT_MAP_TRY(jb) (rt_map_guard_begin(jb), sigsetjmp(jb, 0)) /* jb: a sigjmp_buf (setjmp.h) */

/* The .npy 1.0 header (magic .. the dict padded with spaces and '\n' to a
 * multiple of 64 bytes) of a C-order array into buf.  Returns its length, or
 * 0 if dtype/rank is unsupported or cap is too small (256 is always enough). */
size_t npy_header(char *buf, size_t cap, int dtype, int rank, const int64_t *shape);

/* Write a C-order .npy of dtype and shape (dims >= 0) holding data (numel *
 * elem size bytes) to PATH atomically and never through a planted link
 * (rt_afile_*: a temporary beside it, fsync'ed, renamed, the folder synced).
 * Returns 0, or -1 with a one-line reason naming the file in err. */
int npy_save(const char *path, int dtype, int rank, const int64_t *shape, const void *data,
             char *err, size_t errlen);
/* fsync directory DIR; 0 or -1 with errno set */
int npy_sync_dir(const char *dir);

/* "float32", "uint8", "bfloat16"...: numpy's name of an RT_* dtype; "?" for anything else */
const char *npy_dtype_name(int dtype);
/* bytes per element of an RT_* dtype that .npy files hold (all but bfloat16), 0 if none */
size_t npy_elem_size(int dtype);
/* bytes per element of any RT_* dtype, 0 if unknown */
int64_t rt_elem_size(int dtype);

/* I/O that finishes or fails: retries EINTR and short counts (chunks of
 * 1 GiB); pread past the end is EIO.  Return 0, or -1 with errno set.
 * (rt_write_all: afile.h) */
int rt_pread_all(int fd, void *buf, uint64_t n, uint64_t off);

/* Every file a run reads is opened this way, so that none can hang it: opened
 * O_NONBLOCK (a FIFO without a writer does not block the open), refused unless
 * fstat says it is a regular file (a FIFO, device or directory could block or
 * never end), then switched back to blocking reads.  Returns the fd (and its
 * fstat in *st), -1 with errno set, or -2: not a regular file.  rt_open_why
 * of that return says why, as a message's tail. */
int rt_open_regular(const char *path, struct stat *st);
const char *rt_open_why(int rc);

#endif
