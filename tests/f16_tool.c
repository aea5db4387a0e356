/* f16_tool.c — kernels.h's float16 conversions as a filter, for
 * tests/py/f16_numpy.py to hold against NumPy's float16.
 *
 *   f16_tool to16 IN OUT   IN: little-endian float32 values; OUT: their
 *                          float16 bits (k_f16_from_f32), uint16 each
 *   f16_tool to32 OUT      OUT: k_f16_to_f32 of every float16 bit pattern
 *                          0..65535, as float32
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

static int fail(const char *what, const char *path)
{
    fprintf(stderr, "f16_tool: %s %s\n", what, path);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "to32")) {
        FILE *o = fopen(argv[2], "wb");
        if (!o)
            return fail("cannot write", argv[2]);
        for (uint32_t i = 0; i < 65536; i++) {
            float f = k_f16_to_f32((uint16_t)i);
            if (fwrite(&f, sizeof f, 1, o) != 1)
                return fail("cannot write", argv[2]);
        }
        return fclose(o) ? fail("cannot write", argv[2]) : 0;
    }
    if (argc != 4 || strcmp(argv[1], "to16")) {
        fprintf(stderr, "usage: f16_tool to16 IN OUT | f16_tool to32 OUT\n");
        return 2;
    }
    FILE *in = fopen(argv[2], "rb"), *o = fopen(argv[3], "wb");
    if (!in || !o)
        return fail("cannot open", !in ? argv[2] : argv[3]);
    float f;
    while (fread(&f, sizeof f, 1, in) == 1) {
        uint16_t h = k_f16_from_f32(f);
        if (fwrite(&h, sizeof h, 1, o) != 1)
            return fail("cannot write", argv[3]);
    }
    fclose(in);
    return fclose(o) ? fail("cannot write", argv[3]) : 0;
}
