"""Golden IR tests of the passes: tests/passes/PASS/CASE.ir is the IR before PASS (as --dump-after writes it, or
written by hand: the reader takes comments, '#' lines), CASE.out what `fsdpc --run-pass PASS CASE.ir --verify`
prints: the IR after the pass, or for a refusal "exit 1" and its one-line error.  The "frontend" folder holds the
IR reader's own cases (--run-pass frontend reads and prints back; malformed files give one line naming
FILE:LINE).

usage: run.py FSDPC [PASS ...]              check the cases of each PASS (default: all)
       run.py FSDPC --update [PASS ...]     rewrite the .out files (review the diff: it is the pass's change)
       run.py FSDPC --roundtrip MODEL.onnx ARGS...
           the reader on MODEL's IR after every pass: print(parse(print(g))) == print(g), and --run-pass P on the
           dump before P prints what --dump-after P prints
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def pass_list(fsdpc):
    """the compiler's pass list, as `fsdpc --help` names it under --dump-after"""
    import re
    text = subprocess.run([fsdpc, "--help"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"--dump-after PASS\s+print the IR after PASS \(([^)]*)\)", text)
    return m.group(1).split()


def run_case(fsdpc, pas, path):
    """what the golden file holds for one case: stdout, or for a failure the exit status and stderr"""
    p = subprocess.run([fsdpc, "--run-pass", pas, os.path.basename(path), "--verify"], cwd=os.path.dirname(path),
                       capture_output=True, text=True, timeout=120)
    if p.returncode == 0 and not p.stderr:
        return p.stdout
    return "exit %d\n%s%s" % (p.returncode, p.stderr, p.stdout)


def check_dir(fsdpc, pas, update):
    """every case of pass pas; the number that fail"""
    d = os.path.join(HERE, pas)
    cases = sorted(f for f in os.listdir(d) if f.endswith(".ir")) if os.path.isdir(d) else []
    if not cases:
        print("FAIL %s: no cases in tests/passes/%s" % (pas, pas))
        return 1
    bad = 0
    for c in cases:
        path = os.path.join(d, c)
        got, out = run_case(fsdpc, pas, path), path[:-3] + ".out"
        if update:
            with open(out, "w") as f:
                f.write(got)
            continue
        if got.startswith("exit ") and (not got.startswith("exit 1\n") or got.count("\n") != 2):
            bad += 1
            print("FAIL %s/%s: a refusal must be one line on stderr and exit 1, got:\n%s" % (pas, c, got[:2000]))
            continue
        want = open(out).read() if os.path.exists(out) else None
        if got != want:
            bad += 1
            print("FAIL %s/%s: the output differs from %s (run.py --update rewrites it; review the diff)"
                  % (pas, c, os.path.relpath(out, HERE)))
            import difflib
            sys.stdout.writelines(list(difflib.unified_diff((want or "").splitlines(True), got.splitlines(True),
                                                            "expected", "got", n=1))[:40])
        else:
            print("ok   %s/%s" % (pas, c))
    errors = [c for c in cases if os.path.exists(os.path.join(d, c[:-3] + ".out")) and
              open(os.path.join(d, c[:-3] + ".out")).read().startswith("exit ")]
    print("%s: %d cases (%d refusals), %d failed" % (pas, len(cases), len(errors), bad))
    return bad


def body(text):
    """a dump without its first line ("# after PASS")"""
    return text.split("\n", 1)[1] if text.startswith("#") else text


def roundtrip(fsdpc, model, args, tmp, passes):
    """the reader on every pass's dump of model: the text read back is the same, and each pass run alone on the
    dump before it gives the pipeline's dump"""
    bad, prev = 0, None
    for pas in passes:
        dump = subprocess.run([fsdpc, model, "--dump-after", pas] + args, capture_output=True, text=True,
                              check=True).stdout
        full = subprocess.run([fsdpc, model, "--dump-after", pas, "--dump-data"] + args, capture_output=True,
                              text=True, check=True).stdout
        path, short = os.path.join(tmp, pas + ".ir"), os.path.join(tmp, pas + ".short.ir")
        for p, text in ((path, full), (short, dump)):
            with open(p, "w") as f:
                f.write(text)
        for p, text, flag in ((path, full, ["--dump-data"]), (short, dump, [])):
            again = subprocess.run([fsdpc, "--run-pass", "frontend", p] + flag, capture_output=True, text=True)
            if again.returncode or body(again.stdout) != body(text):
                bad += 1
                print("FAIL %s after %s: the IR read back prints differently %s: %s"
                      % (model, pas, flag, again.stderr.strip()))
        if prev:  # (every byte, as the pipeline has them)
            one = subprocess.run([fsdpc, "--run-pass", pas, prev, "--verify", "--dump-data"], capture_output=True,
                                 text=True)
            if one.returncode or body(one.stdout) != body(full):
                bad += 1
                print("FAIL %s: --run-pass %s on the dump after the pass before differs from --dump-after %s: %s"
                      % (model, pas, pas, one.stderr.strip()))
        prev = path
    print("%s %s: %d passes read back and rerun, %d failed" % (os.path.basename(model), " ".join(args),
                                                                 len(passes), bad))
    return bad


def main():
    fsdpc, rest = os.path.abspath(sys.argv[1]), sys.argv[2:]
    PASSES = pass_list(fsdpc)
    if rest[:1] == ["--roundtrip"]:
        model, args = rest[1], rest[2:]
        import tempfile
        with tempfile.TemporaryDirectory(prefix="fsdpc_roundtrip_") as tmp:
            bad = roundtrip(fsdpc, model, args, tmp, PASSES)
        sys.exit(1 if bad else 0)
    update = "--update" in rest
    names = [a for a in rest if a != "--update"] or PASSES
    for a in names:
        if a not in PASSES:
            sys.exit("run.py: %s is not a pass (%s)" % (a, " ".join(PASSES)))
    missing = [p for p in PASSES if not os.path.isdir(os.path.join(HERE, p))]
    bad = sum(check_dir(fsdpc, p, update) for p in names)
    if missing and not update:
        print("FAIL: no tests/passes folder for %s" % " ".join(missing))
        bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
