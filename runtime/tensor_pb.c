/* tensor_pb.c — `--input NAME=FILE.pb` of forward-only executables: one
 * serialized ONNX TensorProto (as in ONNX's backend test data,
 * test_data_set_0/input_0.pb), checked against the model input and copied
 * into the arena.
 *
 * The file is untrusted: its size is bounded by what a tensor of the input's
 * shape can need, protobuf-c parses it, and dtype, dims and the length of
 * the data (raw_data, or the typed field of its data type) must match
 * exactly.  Supported data types: FLOAT, DOUBLE, INT64, INT32, BOOL, FLOAT16,
 * BFLOAT16 and INT8 .. UINT64 (typed: float_data, double_data, int64_data;
 * uint32 and uint64 in uint64_data; the rest in int32_data, the 16-bit
 * floats as their bits).
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "npy.h"
#include "onnx.pb-c.h"
#include "rt_priv.h"

/* ONNX TensorProto.DataType */
enum { PB_FLOAT = 1, PB_UINT8, PB_INT8, PB_UINT16, PB_INT16, PB_INT32, PB_INT64, PB_BOOL = 9, PB_FLOAT16, PB_DOUBLE,
       PB_UINT32, PB_UINT64, PB_BFLOAT16 = 16 };

static const char *onnx_type_name(int t)
{
    static const char *const names[] = {"undefined", "float",  "uint8",     "int8",       "uint16",
                                        "int16",     "int32",  "int64",     "string",     "bool",
                                        "float16",   "double", "uint32",    "uint64",     "complex64",
                                        "complex128", "bfloat16", "float8e4m3fn", "float8e4m3fnuz",
                                        "float8e5m2", "float8e5m2fnuz", "uint4", "int4"};
    return t >= 0 && t < (int)(sizeof names / sizeof names[0]) ? names[t] : "unknown";
}

static int rt_dtype_of(int t)
{
    switch (t) {
    case PB_FLOAT: return RT_F32;
    case PB_DOUBLE: return RT_F64;
    case PB_INT64: return RT_I64;
    case PB_INT32: return RT_I32;
    case PB_BOOL: return RT_BOOL;
    case PB_FLOAT16: return RT_F16;
    case PB_BFLOAT16: return RT_BF16;
    case PB_INT8: return RT_I8;
    case PB_UINT8: return RT_U8;
    case PB_INT16: return RT_I16;
    case PB_UINT16: return RT_U16;
    case PB_UINT32: return RT_U32;
    case PB_UINT64: return RT_U64;
    default: return 0;
    }
}

/* the whole file, if it is a regular file of at most limit bytes */
static unsigned char *slurp(const RtInput *in, const char *path, uint64_t limit, size_t *len)
{
    struct stat st;
    int fd = rt_open_regular(path, &st);
    if (fd < 0) {
        rt_err_set(1, "--input %s: %s: %s", in->name, path, rt_open_why(fd));
        return NULL;
    }
    unsigned char *buf = NULL;
    if ((uint64_t)st.st_size > limit || (uint64_t)st.st_size >= (uint64_t)SIZE_MAX) {
        rt_err_set(1, "--input %s: %s: %" PRIu64 " bytes is more than a TensorProto of input '%s' can need "
                      "(corrupt file?)", in->name, path, (uint64_t)st.st_size, in->name);
    } else if (!(buf = malloc((size_t)st.st_size + 1))) {
        rt_err_set(1, "--input %s: %s: out of memory", in->name, path);
    } else {
        size_t n = (size_t)st.st_size, got = 0;
        while (got < n) {
            ssize_t r = read(fd, buf + got, n - got > ((size_t)1 << 30) ? ((size_t)1 << 30) : n - got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                rt_err_set(1, "--input %s: reading %s: %s", in->name, path, r < 0 ? strerror(errno) : "file shrank");
                free(buf);
                buf = NULL;
                break;
            }
            got += (size_t)r;
        }
        *len = n;
    }
    close(fd);
    return buf;
}

/* dtype and dims of t against in */
static int check_type_shape(const RtInput *in, const char *path, const Onnx__TensorProto *t)
{
    int ot = t->has_data_type ? t->data_type : 0;
    int dt = rt_dtype_of(ot);
    if (dt == 0) {
        rt_err_set(1, "--input %s: %s: ONNX data type %d (%s) is not supported (supported: float, double, "
                      "float16, bfloat16, bool and the integers)", in->name, path, ot, onnx_type_name(ot));
        return -1;
    }
    for (size_t d = 0; d < t->n_dims; d++)
        if (t->dims[d] < 0) {
            rt_err_set(1, "--input %s: %s: negative dimension %" PRId64, in->name, path, t->dims[d]);
            return -1;
        }
    int same = dt == in->dtype && t->n_dims == (size_t)in->rank;
    for (int d = 0; same && d < in->rank; d++)
        same = t->dims[d] == in->shape[d];
    if (!same) {
        char want[256], got[256];
        rt_dims_str(want, sizeof want, in->rank, in->shape, 0);
        if (t->n_dims > RT_MAX_RANK)
            snprintf(got, sizeof got, "(rank %zu)", t->n_dims);
        else
            rt_dims_str(got, sizeof got, (int)t->n_dims, t->dims, 0);
        rt_err_set(1, "--input %s: %s holds %s %s; input '%s' needs %s %s", in->name, path,
                   npy_dtype_name(dt), got, in->name, npy_dtype_name(in->dtype), want);
        return -1;
    }
    if (t->segment) {
        rt_err_set(1, "--input %s: %s: segmented tensors are not supported", in->name, path);
        return -1;
    }
    if (t->n_external_data > 0 ||
        (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)) {
        rt_err_set(1, "--input %s: %s: external data is not supported (keep the values inside the .pb)",
                   in->name, path);
        return -1;
    }
    return 0;
}

/* the values of t (dtype and dims already checked) into dst */
static int copy_values(const RtInput *in, const char *path, const Onnx__TensorProto *t, int64_t numel,
                       void *dst)
{
    size_t es = (size_t)rt_elem_size(in->dtype), nbytes = (size_t)numel * es;
    const char *field;
    size_t nfield;
    switch (in->dtype) {
    case RT_F32: field = "float_data"; nfield = t->n_float_data; break;
    case RT_F64: field = "double_data"; nfield = t->n_double_data; break;
    case RT_I64: field = "int64_data"; nfield = t->n_int64_data; break;
    case RT_U32: case RT_U64: field = "uint64_data"; nfield = t->n_uint64_data; break;
    default: field = "int32_data"; nfield = t->n_int32_data; break; /* int32, bool, int8 .. uint16, 16-bit floats */
    }
    size_t all = t->n_float_data + t->n_double_data + t->n_int64_data + t->n_int32_data + t->n_uint64_data +
                 t->n_string_data;
    if (all != nfield) {
        rt_err_set(1, "--input %s: %s: a %s tensor with values outside %s (corrupt file?)", in->name, path,
                   npy_dtype_name(in->dtype), field);
        return -1;
    }
    int raw = t->has_raw_data && t->raw_data.len > 0;
    if (raw && nfield > 0) {
        rt_err_set(1, "--input %s: %s: values in both raw_data and %s", in->name, path, field);
        return -1;
    }
    if (raw || (nfield == 0 && numel > 0 && t->has_raw_data)) {
        if (t->raw_data.len != nbytes) {
            rt_err_set(1, "--input %s: %s: raw_data holds %zu bytes; %" PRId64 " %s values need %zu", in->name,
                       path, t->raw_data.len, numel, npy_dtype_name(in->dtype), nbytes);
            return -1;
        }
        if (nbytes)
            memcpy(dst, t->raw_data.data, nbytes);
        return 0;
    }
    if (nfield != (size_t)numel) {
        rt_err_set(1, "--input %s: %s: %s holds %zu values; input '%s' needs %" PRId64, in->name, path, field,
                   nfield, in->name, numel);
        return -1;
    }
    if (numel == 0)
        return 0;
    switch (in->dtype) {
    case RT_F32: memcpy(dst, t->float_data, nbytes); break;
    case RT_F64: memcpy(dst, t->double_data, nbytes); break;
    case RT_I64: memcpy(dst, t->int64_data, nbytes); break;
    case RT_I32: memcpy(dst, t->int32_data, nbytes); break;
    case RT_BOOL:
        for (int64_t k = 0; k < numel; k++)
            ((uint8_t *)dst)[k] = t->int32_data[k] != 0;
        break;
    default: /* the low es bytes of each value (little-endian) */
        for (int64_t k = 0; k < numel; k++) {
            uint64_t v = in->dtype == RT_U32 || in->dtype == RT_U64 ? t->uint64_data[k] : (uint32_t)t->int32_data[k];
            memcpy((char *)dst + k * (int64_t)es, &v, es);
        }
    }
    return 0;
}

int rt_read_tensor_pb(const RtInput *in, const char *path, void *dst)
{
    int64_t numel = 1;
    for (int d = 0; d < in->rank; d++)
        numel *= in->shape[d]; /* fits: the model tables were checked */
    /* the largest honest encoding: 11 bytes per element (a tag and a 10-byte
     * varint) plus names and dims */
    uint64_t limit;
    if (__builtin_mul_overflow((uint64_t)numel, (uint64_t)16, &limit) ||
        __builtin_add_overflow(limit, (uint64_t)1 << 20, &limit))
        limit = UINT64_MAX;
    size_t len = 0;
    unsigned char *buf = slurp(in, path, limit, &len);
    if (!buf)
        return -1;
    Onnx__TensorProto *t = onnx__tensor_proto__unpack(NULL, len, buf);
    int rc = -1;
    if (!t)
        rt_err_set(1, "--input %s: %s is not a serialized ONNX TensorProto", in->name, path);
    else if (check_type_shape(in, path, t) == 0)
        rc = copy_values(in, path, t, numel, dst);
    if (t)
        onnx__tensor_proto__free_unpacked(t, NULL);
    free(buf);
    return rc;
}
