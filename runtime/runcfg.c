/* runcfg.c — run files: the config-file form of an executable's options
 * (--config FILE) and the run.toml every checkpoint holds, read and written
 * in one small subset of TOML (toml.io v1.0).  opts.c maps their keys to
 * options; this file knows only the syntax.
 *
 * The subset, line by line:
 *   # a comment                      (also after a value)
 *   key = "a string"                 basic string: \" \\ \b \t \n \f \r \uXXXX \UXXXXXXXX
 *   key = 'a literal string'         no escapes
 *   key = 1_000                      decimal integer ([+-], '_' between digits)
 *   key = 3e-4                       float (TOML's form: a digit before and after '.')
 *   key = true                       or false
 *   key = ["a", 'b',                 an array of strings, over lines if need be
 *          "c"]                      (comments and a trailing comma allowed)
 * Keys are bare words ([A-Za-z0-9_-]; '_' reads as '-', so warmup_steps is
 * warmup-steps).  Anything else TOML has (tables, dotted or quoted keys,
 * multi-line strings, inline tables, dates, hex, inf, nan) is refused by
 * name, as are a key given twice, a NUL or other control byte, a line over
 * RT_CFG_LINE bytes and a file over RT_CFG_MAX.  Bytes >= 0x80 pass through
 * strings as they are (paths need not be UTF-8).
 *
 * The files are untrusted: every error is one line, "PATH:LINE: what"
 * (rt_err_set, status 2), never a crash; every length is bounded before it
 * is used.  A value becomes the text its flag would get on the command line
 * (a number without '_' or a leading '+', "true"/"false", a string's bytes),
 * so a file and the flags go through the same parser (args.c's rt_set_flag).
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt_priv.h"

/* the parser's state: the text, the cursor and its line */
typedef struct {
    RtCfg *c;
    const char *p, *end;
    int line;
    const char *key; /* the entry being read, for messages */
} Lex;

static int bad(Lex *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(Lex *x, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (x->key)
        rt_err_set(2, "%s:%d: key '%s': %s", x->c->path, x->line, x->key, what);
    else
        rt_err_set(2, "%s:%d: %s", x->c->path, x->line, what);
    return -1;
}

static int at(const Lex *x, char ch) { return x->p < x->end && *x->p == ch; }

static void skip_blanks(Lex *x)
{
    while (x->p < x->end && (*x->p == ' ' || *x->p == '\t'))
        x->p++;
}

/* past blanks and a comment: at the end of the line (its '\n' not consumed), or -1 (something else follows) */
static int end_of_line(Lex *x, const char *after)
{
    skip_blanks(x);
    if (at(x, '#'))
        while (x->p < x->end && *x->p != '\n')
            x->p++;
    if (at(x, '\r') && x->p + 1 < x->end && x->p[1] == '\n')
        x->p++;
    if (x->p < x->end && *x->p != '\n')
        return bad(x, "unexpected '%c' after %s (one key = value per line; # starts a comment)",
                   (unsigned char)*x->p < 0x20 ? '?' : *x->p, after);
    return 0;
}

static int newline(Lex *x)
{
    if (!at(x, '\n'))
        return 0;
    x->p++;
    x->line++;
    return 1;
}

/* the UTF-8 bytes of code point u into out (at least 4 bytes); their number, or 0 for no scalar value */
static int utf8(uint32_t u, char *out)
{
    if (u == 0 || (u >= 0xd800 && u < 0xe000) || u > 0x10ffff)
        return 0;
    if (u < 0x80)
        return out[0] = (char)u, 1;
    if (u < 0x800)
        return out[0] = (char)(0xc0 | u >> 6), out[1] = (char)(0x80 | (u & 63)), 2;
    if (u < 0x10000) {
        out[0] = (char)(0xe0 | u >> 12), out[1] = (char)(0x80 | (u >> 6 & 63)), out[2] = (char)(0x80 | (u & 63));
        return 3;
    }
    out[0] = (char)(0xf0 | u >> 18), out[1] = (char)(0x80 | (u >> 12 & 63));
    out[2] = (char)(0x80 | (u >> 6 & 63)), out[3] = (char)(0x80 | (u & 63));
    return 4;
}

/* the escape after a '\' of a basic string into out; its length, or -1 */
static int escape(Lex *x, char *out)
{
    static const char from[] = "btnfr\"\\", to[] = "\b\t\n\f\r\"\\";
    if (x->p >= x->end || *x->p == '\n')
        return bad(x, "unterminated string (a '\\' ends the line)");
    char e = *x->p++;
    const char *k = strchr(from, e);
    if (k && e)
        return out[0] = to[k - from], 1;
    if (e != 'u' && e != 'U')
        return bad(x, "unknown escape '\\%c' in a string (write '\\\\' for a backslash, or use a 'literal string')",
                   (unsigned char)e < 0x20 ? '?' : e);
    int digits = e == 'u' ? 4 : 8;
    uint32_t u = 0;
    for (int i = 0; i < digits; i++, x->p++) {
        const char *hx = x->p < x->end ? strchr("0123456789abcdef", *x->p | 0x20) : NULL;
        if (!hx || !*x->p)
            return bad(x, "'\\%c' needs %d hex digits", e, digits);
        u = u << 4 | (uint32_t)(hx - "0123456789abcdef");
    }
    int n = utf8(u, out);
    return n ? n : bad(x, "'\\%c%0*X' is not a character a string may hold", e, digits, u);
}

/* a string (x->p at its quote) into a malloc'd *out */
static int string(Lex *x, char **out)
{
    char q = *x->p;
    if (x->end - x->p >= 3 && x->p[1] == q && x->p[2] == q)
        return bad(x, "multi-line strings (%c%c%c) are not supported: write the string on one line", q, q, q);
    const char *start = ++x->p;
    size_t cap = 0; /* the rest of the line: the string is no longer (an escape never writes more than it reads) */
    while (start + cap < x->end && start[cap] != '\n')
        cap++;
    char *s = malloc(cap + 1);
    if (!s)
        return bad(x, "out of memory");
    size_t n = 0;
    while (x->p < x->end && *x->p != q && *x->p != '\n') {
        unsigned char ch = (unsigned char)*x->p;
        if ((ch < 0x20 && ch != '\t') || ch == 0x7f) {
            free(s);
            return bad(x, "a control character (byte 0x%02x) in a string: write it as an escape", ch);
        }
        x->p++;
        if (ch == '\\' && q == '"') {
            char e[4];
            int k = escape(x, e);
            if (k < 0 || n + (size_t)k > cap) { /* an escape is never shorter than what it writes */
                free(s);
                return k < 0 ? -1 : bad(x, "a malformed escape");
            }
            memcpy(s + n, e, (size_t)k);
            n += (size_t)k;
        } else {
            s[n++] = (char)ch;
        }
    }
    if (!at(x, q)) {
        free(s);
        return bad(x, "unterminated string (no closing %c on this line)", q);
    }
    x->p++;
    s[n] = 0;
    *out = s;
    return 0;
}

/* digits with single '_' between them, from x->p; how many digits (0: none or a misplaced '_') */
static int digits(Lex *x)
{
    int n = 0;
    while (x->p < x->end && ((*x->p >= '0' && *x->p <= '9') || (*x->p == '_' && n > 0))) {
        if (*x->p == '_' && (x->p + 1 >= x->end || x->p[1] < '0' || x->p[1] > '9'))
            return 0;
        n += *x->p++ != '_';
    }
    return n;
}

/* a decimal integer or float in TOML's form into a malloc'd *out (no '_', no leading '+'); *type RT_CV_INT or
 * RT_CV_REAL */
static int number(Lex *x, char **out, int *type)
{
    const char *s = x->p;
    if (at(x, '+') || at(x, '-'))
        x->p++;
    const char *int_part = x->p;
    if (x->end - x->p >= 3 && (!strncmp(x->p, "inf", 3) || !strncmp(x->p, "nan", 3)))
        return bad(x, "not a finite number");
    if (x->end - x->p >= 2 && x->p[0] == '0' && strchr("xob", x->p[1]) && x->p[1])
        return bad(x, "only decimal numbers are read (no 0x, 0o, 0b)");
    int nd = digits(x);
    if (nd == 0)
        return bad(x, "not a value: expected a \"string\", a number, true, false or [\"an\", \"array\"]");
    if (nd > 1 && *int_part == '0')
        return bad(x, "a number with a leading zero");
    *type = RT_CV_INT;
    if (at(x, '.')) {
        x->p++;
        if (digits(x) == 0)
            return bad(x, "a malformed number: '.' needs a digit on each side");
        *type = RT_CV_REAL;
    }
    if (at(x, 'e') || at(x, 'E')) {
        x->p++;
        if (at(x, '+') || at(x, '-'))
            x->p++;
        if (digits(x) == 0)
            return bad(x, "a malformed number: the exponent needs digits");
        *type = RT_CV_REAL;
    }
    if (x->p < x->end && (!*x->p || !strchr(" \t\r\n#,]", *x->p)))
        return bad(x, "a malformed number (a number is decimal digits, '.', 'e', '_' between digits)");
    size_t len = (size_t)(x->p - s);
    char *v = malloc(len + 1), *w = v;
    if (!v)
        return bad(x, "out of memory");
    for (const char *r = *s == '+' ? s + 1 : s; r < x->p; r++)
        if (*r != '_')
            *w++ = *r;
    *w = 0;
    *out = v;
    return 0;
}

/* append v to e's values */
static int push(Lex *x, RtCfgEntry *e, char *v)
{
    char **q = realloc(e->val, sizeof *q * (size_t)(e->nval + 1));
    if (!q) {
        free(v);
        return bad(x, "out of memory");
    }
    e->val = q;
    e->val[e->nval++] = v;
    return 0;
}

/* past blanks, comments and line ends inside an array */
static void skip_array_space(Lex *x)
{
    for (;;) {
        skip_blanks(x);
        if (at(x, '#'))
            while (x->p < x->end && *x->p != '\n')
                x->p++;
        if (at(x, '\r') && x->p + 1 < x->end && x->p[1] == '\n')
            x->p++;
        if (!newline(x))
            return;
    }
}

/* an array of strings (x->p at '[') into e */
static int array(Lex *x, RtCfgEntry *e)
{
    x->p++;
    e->type = RT_CV_ARRAY;
    for (;;) {
        skip_array_space(x);
        if (at(x, ']')) {
            x->p++;
            return 0;
        }
        if (x->p >= x->end)
            return bad(x, "unterminated array (no closing ']')");
        if (!at(x, '"') && !at(x, '\''))
            return bad(x, "an array holds \"strings\" only (one per --flag it stands for)");
        char *v;
        if (string(x, &v) != 0 || push(x, e, v) != 0)
            return -1;
        skip_array_space(x);
        if (at(x, ','))
            x->p++;
        else if (!at(x, ']'))
            return bad(x, "expected ',' or ']' after an array's string");
    }
}

/* the value after '=' into e */
static int value(Lex *x, RtCfgEntry *e)
{
    char *v = NULL;
    if (x->p >= x->end || *x->p == '\n' || *x->p == '#')
        return bad(x, "no value after '='");
    if (at(x, '['))
        return array(x, e);
    if (at(x, '{'))
        return bad(x, "inline tables ({...}) are not supported");
    if (at(x, '"') || at(x, '\'')) {
        e->type = RT_CV_STR;
        if (string(x, &v) != 0)
            return -1;
    } else if (x->end - x->p >= 4 && !strncmp(x->p, "true", 4)) {
        e->type = RT_CV_BOOL;
        x->p += 4;
        v = strdup("true");
    } else if (x->end - x->p >= 5 && !strncmp(x->p, "false", 5)) {
        e->type = RT_CV_BOOL;
        x->p += 5;
        v = strdup("false");
    } else if (number(x, &v, &e->type) != 0) {
        return -1;
    }
    return v ? push(x, e, v) : bad(x, "out of memory");
}

static int key_char(char ch)
{
    return ch == '-' || ch == '_' || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
}

/* a bare key (x->p at its first byte) into e->key, '_' read as '-' */
static int key(Lex *x, RtCfgEntry *e)
{
    const char *s = x->p;
    while (x->p < x->end && key_char(*x->p))
        x->p++;
    size_t n = (size_t)(x->p - s);
    if (n == 0 && at(x, '['))
        return bad(x, "tables ([...]) are not supported: write key = value lines, one per option");
    if (n == 0 && (at(x, '"') || at(x, '\'')))
        return bad(x, "quoted keys are not supported: keys are option names without '--' (lr = 3e-4)");
    if (n == 0)
        return bad(x, "expected key = value (a key is an option's name without '--', e.g. lr = 3e-4)");
    if (n > 64)
        return bad(x, "a key of %zu bytes: no option has such a name", n);
    e->key = strndup(s, n);
    if (!e->key)
        return bad(x, "out of memory");
    for (char *k = e->key; *k; k++)
        if (*k == '_')
            *k = '-';
    x->key = e->key;
    skip_blanks(x);
    if (at(x, '.'))
        return bad(x, "dotted keys are not supported: keys are option names without '--'");
    if (!at(x, '='))
        return bad(x, "expected '=' after the key");
    x->p++;
    skip_blanks(x);
    return 0;
}

/* one key = value statement (x->p at the key) appended to c */
static int statement(Lex *x)
{
    RtCfg *c = x->c;
    RtCfgEntry *q = realloc(c->e, sizeof *q * (size_t)(c->n + 1));
    if (!q)
        return bad(x, "out of memory");
    c->e = q;
    RtCfgEntry *e = &c->e[c->n++];
    memset(e, 0, sizeof *e);
    e->line = x->line;
    if (key(x, e) != 0 || value(x, e) != 0 || end_of_line(x, "the value") != 0)
        return -1;
    for (int i = 0; i < c->n - 1; i++)
        if (!strcmp(c->e[i].key, e->key))
            return bad(x, "given twice (first on line %d)", c->e[i].line);
    x->key = NULL;
    return 0;
}

/* no NUL or control byte but tab, CR and LF; no line longer than RT_CFG_LINE */
static int check_bytes(Lex *x)
{
    const char *line_start = x->p;
    for (const char *p = x->p; p < x->end; p++) {
        unsigned char ch = (unsigned char)*p;
        if (ch == '\n') {
            x->line++;
            line_start = p + 1;
        } else if (p - line_start >= RT_CFG_LINE) {
            return bad(x, "a line longer than %d bytes: not a run file", RT_CFG_LINE);
        } else if ((ch < 0x20 && ch != '\t' && ch != '\r') || ch == 0x7f) {
            return bad(x, "a control byte (0x%02x): not a text file", ch);
        }
    }
    x->line = 1;
    return 0;
}

int rt_cfg_parse(RtCfg *c, const char *text, size_t n)
{
    Lex x = {c, text, text + n, 1, NULL};
    if (check_bytes(&x) != 0)
        return -1;
    while (x.p < x.end) {
        skip_blanks(&x);
        if (newline(&x))
            continue;
        if (at(&x, '#') || at(&x, '\r')) {
            if (end_of_line(&x, "a comment") != 0)
                return -1;
            newline(&x);
            continue;
        }
        if (statement(&x) != 0)
            return -1;
        newline(&x);
    }
    return 0;
}

int rt_cfg_load(RtCfg *c, const char *what, const char *path, int nofollow, int missing_ok)
{
    memset(c, 0, sizeof *c);
    c->path = strdup(path);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | (nofollow ? O_NOFOLLOW : 0));
    struct stat st;
    if (fd < 0 && errno == ENOENT && missing_ok)
        return 1;
    int e = errno;
    if (!c->path || fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > RT_CFG_MAX) {
        int reg = fd >= 0 && S_ISREG(st.st_mode);
        rt_err_set(2, "%s %s: %s", what, path, !c->path ? "out of memory" : fd < 0 && e == ELOOP && nofollow
                   ? "a symbolic link (refused: a checkpoint's run.toml is a file fsdpc wrote, never a link)"
                   : fd < 0 ? strerror(e) : !reg ? "not a regular file" : "larger than 1 MiB: not a run file");
        if (fd >= 0)
            close(fd);
        return -1;
    }
    char *text = malloc((size_t)st.st_size + 1);
    int rc = text ? rt_pread_all(fd, text, (uint64_t)st.st_size, 0) : -1;
    if (rc != 0)
        rt_err_set(2, "%s %s: %s", what, path, text ? strerror(errno) : "out of memory");
    close(fd);
    rc = rc == 0 ? rt_cfg_parse(c, text, (size_t)st.st_size) : -1;
    free(text);
    return rc;
}

void rt_cfg_free(RtCfg *c)
{
    for (int i = 0; c->e && i < c->n; i++) {
        for (int k = 0; k < c->e[i].nval; k++)
            free(c->e[i].val[k]);
        free(c->e[i].val);
        free(c->e[i].key);
    }
    free(c->e);
    free(c->path);
    memset(c, 0, sizeof *c);
}

/* ------------------------------------------------------------------ writing */

void rt_str_add(RtStr *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || b->bad || (size_t)n > SIZE_MAX / 2 - b->n) {
        b->bad = 1;
        return;
    }
    if (b->n + (size_t)n + 1 > b->cap) {
        size_t cap = (b->n + (size_t)n + 1) * 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->bad = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

void rt_cfg_put_string(RtStr *b, const char *s)
{
    rt_str_add(b, "\"");
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            rt_str_add(b, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f)
            rt_str_add(b, "\\u%04X", ch);
        else
            rt_str_add(b, "%c", ch);
    }
    rt_str_add(b, "\"");
}

void rt_cfg_put_real(RtStr *b, double v)
{
    char s[40];
    int prec = 1;
    for (;; prec++) { /* the fewest digits that read back as v (17 always do) */
        snprintf(s, sizeof s, "%.*g", prec, v);
        if (prec == 17 || strtod(s, NULL) == v)
            break;
    }
    const char *e = strchr(s, 'e');
    int x = e ? atoi(e + 1) : -1;
    if (x >= prec && x < 17) /* 10, not 1e+01: as many digits as the integer part has */
        snprintf(s, sizeof s, "%.*g", x + 1, v);
    rt_str_add(b, "%s%s", s, strpbrk(s, ".e") ? "" : ".0"); /* 10 -> 10.0: a TOML float */
}
