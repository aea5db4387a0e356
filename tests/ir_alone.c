/* ir_alone.c — the IR layer on its own: read IR text, verify it, print it back.
 *
 *   ir_alone FILE.ir PASS      (PASS: the pass the file was dumped after, as ir_verify names it)
 *
 * Built from ir/ (ir.c, print.c, parse.c, verify.c, build.c, rules/) and kernels/c alone, without
 * frontend/, passes/ or codegen/: the link fails if anything in ir/ calls into them, which keeps
 * the layers' arrows pointing one way (DESIGN.md's house: passes read ir/, never the reverse).  The
 * ctest ir_alone runs it on a golden file and compares the text it prints with the file's.
 */
#include "ir.h"

#include <stdio.h>

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: ir_alone FILE.ir PASS\n");
        return 2;
    }
    Options o = {.model = argv[1]};
    Graph *g = ir_parse(&o);
    ir_verify(g, argv[2]);
    ir_print(stdout, g);
    return 0;
}
