#!/usr/bin/python3
"""docs/ops.md from ir/ops.def: the ONNX ops fsdpc accepts, with their opsets, dtypes, gradients and limits.

usage: python3 scripts/gen_ops_md.py [--check] [--root DIR]

Writes DIR/docs/ops.md (DIR: the repository, by default this script's parent).  --check writes nothing: it
exits 1 with one line when docs/ops.md is not what it would write (the ctest docs_ops runs it), so the page
cannot drift from the op table.

What it reads, all from ir/ops.def but the opset range (frontend/fe.h's OPSET_MIN, OPSET_MAX):
  - the rows: OP(name, since, types, inmin, inmax, outmin, outmax, diff, flags) and the EW1 / EW2 / EW2D rows,
    expanded through the default #define of each in ops.def's head (so a row's facts are read, never
    restated here); rows with since 0 (fsdpc's own ops) are left out;
  - the text of each dtype class (T_FLOAT ...) from the head's list of them;
  - the sections ("/* --- title: text // notes --- */"), one table each; a row's comment is its limits
    column; in headings and comments, what follows " // " is for developers and stays out.
Debian's /usr/bin/python3, the standard library only.
"""
import argparse
import difflib
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join("docs", "ops.md")


def fail(msg):
    sys.exit("gen_ops_md: " + msg)


def split_args(s):
    """the top-level comma-separated arguments of a macro call's text between its parentheses"""
    args, depth, cur, quote = [], 0, "", False
    for ch in s:
        if ch == '"':
            quote = not quote
        elif not quote and ch in "([":
            depth += 1
        elif not quote and ch in ")]":
            depth -= 1
        if ch == "," and depth == 0 and not quote:
            args.append(cur.strip())
            cur = ""
        else:
            cur += ch
    args.append(cur.strip())
    return args


def call(line):
    """(macro, args, comment) of a row 'NAME(args)  /* comment */', or None"""
    m = re.match(r"(OP|EW1|EW2|EW2D)\(", line)
    if not m:
        return None
    depth, quote = 0, False
    for i in range(m.end() - 1, len(line)):
        ch = line[i]
        if ch == '"':
            quote = not quote
        elif not quote and ch == "(":
            depth += 1
        elif not quote and ch == ")":
            depth -= 1
            if depth == 0:
                rest = line[i + 1:].strip()
                c = re.fullmatch(r"/\*(.*)\*/", rest)
                if rest and not c:
                    fail("ir/ops.def: after %s(...) expected a /* comment */, found %r" % (m.group(1), rest))
                return m.group(1), split_args(line[m.end():i]), c.group(1).strip() if c else ""
    fail("ir/ops.def: unbalanced parentheses in %r" % line)


def c_value(expr, names):
    """the value of one of ops.def's column expressions: integers, T_ names, ( ), <, ?: and |"""
    expr = expr.strip()
    while expr.startswith("(") and expr.endswith(")") and balanced(expr[1:-1]):
        expr = expr[1:-1].strip()
    m = top_level(expr, "?")
    if m is not None:
        cond, rest = expr[:m], expr[m + 1:]
        k = top_level(rest, ":")
        return c_value(rest[:k], names) if c_value(cond, names) else c_value(rest[k + 1:], names)
    k = top_level(expr, "<")
    if k is not None:
        return c_value(expr[:k], names) < c_value(expr[k + 1:], names)
    if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", expr):
        return int(expr, 0)
    if expr in names:
        return names[expr]
    return expr  # a name (T_FLOAT) or a flags expression: kept as text


def balanced(s):
    """are s's parentheses balanced (so '(a) < (b)' is not taken for one parenthesized whole)?"""
    d = 0
    for ch in s:
        d += ch == "("
        d -= ch == ")"
        if d < 0:
            return False
    return d == 0


def top_level(s, op):
    """the index of the first op character of s outside parentheses, or None"""
    d = 0
    for i, ch in enumerate(s):
        d += ch == "("
        d -= ch == ")"
        if ch == op and d == 0:
            return i
    return None


def defaults(text):
    """{macro: (params, OP args)} from ops.def's '#define EW1(name, ...) OP(...)' lines"""
    out = {}
    for m in re.finditer(r"#define (EW1|EW2|EW2D)\(([^)]*)\)((?:\\\n|[^\n])*)", text):
        body = m.group(3).replace("\\\n", " ").strip()
        c = call(body)
        if not c or c[0] != "OP":
            fail("ir/ops.def: #define %s does not expand to one OP(...)" % m.group(1))
        out[m.group(1)] = ([p.strip() for p in m.group(2).split(",")], c[1])
    return out


def expand(macro, args, macros):
    """OP's nine arguments of a row: OP's own, or an EW row's through its default #define"""
    if macro == "OP":
        return args
    params, body = macros[macro]
    if len(args) != len(params):
        fail("ir/ops.def: %s(%s) has %d arguments, its #define %d" % (macro, args[0], len(args), len(params)))
    sub = dict(zip(params, args))
    return [re.sub(r"\b\w+\b", lambda w: sub.get(w.group(0), w.group(0)), a) for a in body]


def user_text(comment):
    """the user's part of a comment: up to ' // ' (the developers' notes follow)"""
    return re.split(r"(?:^|\s)//(?:\s|$)", comment, maxsplit=1)[0].strip()


def dtype_classes(text):
    """{T_X: its text} from the head's list ('*          T_FLOAT   float32, float64')"""
    out = dict(re.findall(r"^ \*\s+(T_[A-Z]+)\s+(.+?)\s*$", text, re.M))
    if "T_FLOAT" not in out:
        fail("ir/ops.def: the head lists no dtype classes (T_FLOAT ...)")
    return out


def read_def(text):
    """[(title, intro, [op row dicts])] in file order, the ONNX rows only"""
    macros, classes = defaults(text), dtype_classes(text)
    sections, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("/* ---"):
            head = line
            while "*/" not in head:
                i += 1
                head += " " + lines[i].strip().lstrip("*").strip()
            head = re.sub(r"^/\* -+\s*|\s*-*\s*\*/$", "", head).strip()
            if not head.startswith("end "):
                title, _, intro = head.partition(":")
                sections.append((title.strip(), user_text(intro.strip()), []))
        else:
            c = call(line)
            if c:
                macro, args, comment = c
                name, since, types, inmin, inmax, _outmin, _outmax, diff, _flags = expand(macro, args, macros)
                since = c_value(since, {})
                if since:
                    types = c_value(types, {})
                    if types not in classes:
                        fail("ir/ops.def: %s's types %s is not in the head's list of dtype classes" % (name, types))
                    if not sections:
                        fail("ir/ops.def: %s comes before the first section" % name)
                    sections[-1][2].append({
                        "name": name, "since": since, "class": types, "types": classes[types],
                        "inmin": c_value(inmin, {}), "inmax": c_value(inmax, {}),
                        "diff": c_value(diff, {}), "limits": user_text(comment)})
        i += 1
    return [s for s in sections if s[2]]


def opset_range(text):
    """(OPSET_MIN, OPSET_MAX) of frontend/fe.h"""
    lo, hi = (re.search(r"\b%s\s*=\s*(\d+)" % k, text) for k in ("OPSET_MIN", "OPSET_MAX"))
    if not lo or not hi:
        fail("frontend/fe.h defines no OPSET_MIN / OPSET_MAX")
    return int(lo.group(1)), int(hi.group(1))


def ordinal(i):
    return "%d%s" % (i, {1: "st", 2: "nd", 3: "rd"}.get(i if i < 20 else i % 10, "th"))


def gradient(op):
    """which inputs carry a gradient, in words: 'all', '1st, 3rd', or '-'"""
    d = op["diff"] & 0xffffffff
    if not d:
        return "-"
    n = op["inmax"] if op["inmax"] >= 0 else None
    if n is None or d == (1 << n) - 1 or d == 0xffffffff:
        return "all" if n is None or n > 1 else "1st"
    return ", ".join(ordinal(i + 1) for i in range(32) if d >> i & 1)


def cell(s):
    return s.replace("|", "\\|") if s else ""


def render(sections, lo, hi):
    count = sum(len(s[2]) for s in sections)
    out = [
        "# Supported ONNX ops",
        "",
        "<!-- Generated by scripts/gen_ops_md.py from ir/ops.def; do not edit: edit ir/ops.def and run",
        "     python3 scripts/gen_ops_md.py (the test docs_ops fails while this page is stale). -->",
        "",
        "fsdpc reads ONNX models of opsets %d to %d (of the default domain, `ai.onnx`) and accepts the %d ops below."
        % (lo, hi, count),
        "A model using any other op, or an op of another domain (`com.microsoft`, ...), is refused at compile time",
        "with one line naming the node and the op.  Model-local functions are inlined first, so only the ops inside",
        "them count.  Shapes are static: inputs that decide a shape must be constants once `--dim` binds the",
        "symbolic dimensions.",
        "",
        "How to read the tables:",
        "",
        "- **opsets**: the model opsets at which fsdpc reads the op.  An op ONNX introduced after opset %d starts"
        % lo,
        "  later; a model whose opset predates it is refused.  Each op is read with the semantics of the version",
        "  the model's opset gives it (ReduceMean's axes are an attribute before opset 18 and an input from 18 on;",
        "  before opset 13 Softmax, LogSoftmax and Hardmax work on the input made 2-D at axis, and Split's split,",
        "  Squeeze's axes, Pad's pads, Slice's starts and TopK's k are attributes).",
        "- **dtypes**: the tensor dtypes the op computes in: float32, float64, int64, int32 and bool.  A model may",
        "  also hold int8, uint8, int16, uint16, uint32, uint64, float16 and bfloat16 tensors: every op reads them",
        "  widened (the integers to int64, the 16-bit floats to float32, so an op listed with int64 takes every",
        "  integer and one listed with float32 takes float16 and bfloat16) and writes its result in their dtype",
        "  (integers wrap as NumPy's; uint64 only moves, adds, subtracts, multiplies and compares equal: the rest",
        "  is refused).  `--precision bf16` or `fp16` computes a float32 model's parameters in 16 bits.",
        "- **gradient**: the inputs a gradient flows back to when training (1st = the op's first input in ONNX's",
        "  order; - = none: indices, shapes, masks and the like).",
        "- **limits**: what must hold for fsdpc to read the op, the attributes and outputs it reads, and the",
        "  forms it refuses (each refusal is one line naming the node).  An empty cell: the op as ONNX defines it.",
        "",
        "fsdpc's own ops (collectives, optimizer updates, gradient and fused ops), which appear in `--dump-after`",
        "output, are not listed: ir/ops.def documents them.",
    ]
    for title, intro, ops in sections:
        out += ["", "## " + title[:1].upper() + title[1:], ""]
        if intro:
            out += [intro[:1].upper() + intro[1:].rstrip(".") + ".", ""]
        out += ["| op | opsets | dtypes | gradient | limits |", "|---|---|---|---|---|"]
        for op in ops:
            out.append("| %s | %d-%d | %s | %s | %s |" % (op["name"], op["since"], hi, cell(op["types"]),
                                                         gradient(op), cell(op["limits"])))
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/ops.md is stale; write nothing")
    ap.add_argument("--root", default=os.path.dirname(HERE), help="the repository (default: %(default)s)")
    a = ap.parse_args()
    read = lambda p: open(os.path.join(a.root, p), encoding="utf-8").read()
    text = render(read_def(read("ir/ops.def")), *opset_range(read("frontend/fe.h")))
    path = os.path.join(a.root, OUT)
    if a.check:
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
        if old != text:
            diff = [l for l in difflib.unified_diff(old.split("\n"), text.split("\n"), lineterm="", n=0)
                    if l.startswith("@@")]
            where = diff[0] if diff else "(missing)"
            fail("%s is stale against ir/ops.def (first difference %s): run python3 scripts/gen_ops_md.py and "
                 "commit it" % (OUT, where))
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    main()
