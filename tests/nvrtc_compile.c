/* nvrtc_compile.c — compiles kernels/cuda the way fsdpc does: a developer's
 * tool for NVRTC's per-kernel register and spill report (-v), no test (that
 * the sources compile is cuda_target's first build, by fsdpc itself).
 *
 *   nvrtc_compile [-v] [-I DIR] ARCHS common.cuh a.cu b.cu ...
 *
 * ARCHS is a comma-separated list (sm_80,sm_90).  The program is the library
 * codegen/cuda.c builds (the kernels of kernels.def; a model's fused kernels
 * are a second program there): `#include "common.cuh"` and then every .cu file in
 * the order given, the .cu files alphabetical (the order of
 * FSDPC_CUDA_SOURCES; a trailing header such as kernels/c/fused.h is text like them); common.cuh is handed to NVRTC as that header.  Each
 * arch is compiled with --std=c++17 -default-device -I DIR (default
 * /usr/local/cuda/include) to a cubin; -v adds --ptxas-options=-v, whose
 * per-kernel registers, stack and spills go to the log.  The NVRTC log is
 * printed; the exit status is 1 if any arch fails (2 on bad usage).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvrtc.h>

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (!s || fread(s, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "%s: read failed\n", path);
        exit(2);
    }
    s[n] = 0;
    fclose(f);
    return s;
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* "#include "common.cuh"" and every .cu file, as codegen/cuda.c does */
static char *program(int n, char **files)
{
    size_t cap = 64, len = 0;
    char **text = malloc(sizeof(char *) * (size_t)n);
    for (int i = 0; i < n; i++) {
        const char *a = i > 0 ? strrchr(files[i - 1], '.') : NULL, *b = strrchr(files[i], '.');
        if (a && b && !strcmp(a, ".cu") && !strcmp(b, ".cu") &&
            strcmp(base_name(files[i - 1]), base_name(files[i])) >= 0) {
            fprintf(stderr, "nvrtc_compile: %s must come before %s (alphabetical order)\n",
                    files[i], files[i - 1]);
            exit(2);
        }
        text[i] = read_file(files[i]);
        cap += strlen(text[i]) + strlen(files[i]) + 32;
    }
    char *p = malloc(cap);
    len += (size_t)sprintf(p, "#include \"%s\"\n", "common.cuh");
    for (int i = 0; i < n; i++)
        len += (size_t)sprintf(p + len, "/* ---- %s ---- */\n%s\n", base_name(files[i]), text[i]);
    free(text);
    return p;
}

static int compile(const char *src, const char *hdr, const char *arch, const char *inc, int verbose)
{
    nvrtcProgram prog;
    const char *hdr_name = "common.cuh";
    char archopt[64], incopt[1024];
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
    snprintf(incopt, sizeof incopt, "-I%s", inc);
    const char *opts[] = {archopt, "--std=c++17", "-default-device", incopt, "--ptxas-options=-v"};
    nvrtcResult rc = nvrtcCreateProgram(&prog, src, "fsdpc_kernels.cu", 1, &hdr, &hdr_name);
    if (rc != NVRTC_SUCCESS) {
        fprintf(stderr, "nvrtcCreateProgram: %s\n", nvrtcGetErrorString(rc));
        return 1;
    }
    rc = nvrtcCompileProgram(prog, verbose ? 5 : 4, opts);
    size_t loglen = 0, cubin = 0;
    nvrtcGetProgramLogSize(prog, &loglen);
    char *log = malloc(loglen + 1);
    log[0] = 0;
    if (loglen)
        nvrtcGetProgramLog(prog, log);
    if (rc == NVRTC_SUCCESS)
        nvrtcGetCUBINSize(prog, &cubin);
    printf("---- %s: %s, cubin %zu bytes\n%s", arch, nvrtcGetErrorString(rc), cubin, log);
    free(log);
    nvrtcDestroyProgram(&prog);
    return rc != NVRTC_SUCCESS || cubin == 0;
}

int main(int argc, char **argv)
{
    int verbose = 0, a = 1;
    const char *inc = "/usr/local/cuda/include";
    for (; a < argc && argv[a][0] == '-'; a++) {
        if (!strcmp(argv[a], "-v"))
            verbose = 1;
        else if (!strcmp(argv[a], "-I") && a + 1 < argc)
            inc = argv[++a];
        else
            break;
    }
    if (argc - a < 2) {
        fprintf(stderr, "usage: nvrtc_compile [-v] [-I DIR] sm_80,sm_90 common.cuh a.cu ...\n");
        return 2;
    }
    char *archs = argv[a], *hdr = read_file(argv[a + 1]), *src = program(argc - a - 2, argv + a + 2);
    int failed = 0;
    for (char *arch = strtok(archs, ","); arch; arch = strtok(NULL, ","))
        failed |= compile(src, hdr, arch, inc, verbose);
    free(src);
    free(hdr);
    return failed;
}
