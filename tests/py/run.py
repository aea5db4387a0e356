"""run.py SCRIPT ARGS...: runs the test SCRIPT (a file of tests/py) with ARGS in this interpreter, as
`python3 SCRIPT ARGS...` would, and when it passes (exits 0) removes its folders: those of ARGS that lie directly
in the suite's work folder (FSDPC_TEST_WORK, which tests/CMakeLists.txt sets for every test).  A test that fails
leaves its folder as it was, to be read; FSDPC_KEEP_WORK=1 keeps every folder.

Why: a clean clone's suite left 9 GB in its two work folders (ResNet-18's 1.8 GB, the cuda models' 1.2 GB...),
more than some machines of this kind have free: the CI run of 2026-11-28 ran out of disk.  With this, what the
suite holds on disk at any moment is the files of the tests running, those that failed and the shared caches.
"""
import os
import runpy
import sys

from common import tidy


def own_folders(args, work):
    """The arguments naming a folder directly inside `work` (not `work` itself, nor a shared folder deeper)."""
    root = os.path.realpath(work)
    out = []
    for a in args:
        p = os.path.abspath(a)
        if os.path.realpath(os.path.dirname(p)) == root and os.path.isdir(p) and not os.path.islink(p):
            out.append(p)
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: run.py SCRIPT [ARGS...]")
    script, args = sys.argv[1], sys.argv[2:]
    sys.argv = [script] + args
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code
        if code is not None and code != 0:
            raise
    work = os.environ.get("FSDPC_TEST_WORK")
    for d in own_folders(args, work) if work else []:
        tidy(d)  # (kept under FSDPC_KEEP_WORK=1)
    sys.exit(0)


if __name__ == "__main__":
    main()
