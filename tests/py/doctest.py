"""doctest.py — the commands of README.md and docs/*.md, run as a reader would.

    doctest.py FSDPC REPO WORK [PAGE.md ...]     (no pages: README.md and docs/*.md)
    doctest.py --list REPO [PAGE.md ...]         the blocks and whether each runs

The convention the pages follow (docs/tests.md says it for writers):
- every fenced block names its kind: ```sh is a command a reader types; ```text
  is output or anything else; ```python, ```toml ... are files.  A bare ```
  fence is an error, so no command hides from this test;
- a ```sh block runs unless the line right above its fence is
  `<!-- not run: REASON -->` (a GPU, two hosts, a download from PyPI, the demo's
  minutes...); the reasons are printed, so what is not run is in the log;
- the runnable blocks of one page run in order as one bash script, like one
  terminal (cwd and exported variables carry over), in a fresh scratch folder
  holding examples/ and scripts/ (links to the repository's) and build/fsdpc
  (the compiler under test); PATH starts with a folder holding `fsdpc`, then
  /usr/bin, so `python3` is Debian's.  OPENBLAS_NUM_THREADS and OMP_NUM_THREADS
  are 1; OMPI_ALLOW_RUN_AS_ROOT is not set: a page that runs mpirun says itself
  what root needs.  Every command must succeed.

A failure names the page, the block's line and the command's last output.
"""
import os
import re
import shutil
import subprocess
import sys
import time

FENCE = re.compile(r"^(\s*)(```+|~~~+)(.*)$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(\S.*?)\s*-->\s*$")
PAGE_SECONDS = 300


def blocks(path):
    """The fenced blocks of a markdown file: (line, kind, text, reason or None)."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.group(1), m.group(2), m.group(3).strip()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence) and lines[i].strip().strip(fence[0]) == ""):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        if i == len(lines):
            raise SystemExit("%s:%d: the block opened here is never closed" % (path, start))
        i += 1
        kind = info.split()[0] if info else ""
        prev = lines[start - 2] if start >= 2 else ""
        r = NOT_RUN.match(prev)
        out.append((start, kind, "\n".join(body), r.group(1) if r else None))
    return out


def pages(repo, names):
    if names:
        return [os.path.join(repo, n) if not os.path.isabs(n) else n for n in names]
    d = os.path.join(repo, "docs")
    return [os.path.join(repo, "README.md")] + sorted(
        os.path.join(d, f) for f in os.listdir(d) if f.endswith(".md"))


def check_page(path):
    """Refuse bare fences and reasons on blocks that are not commands."""
    bad = []
    for line, kind, _, reason in blocks(path):
        if not kind:
            bad.append("%s:%d: a bare ``` fence: name the block's kind (sh for commands, text for output)"
                       % (path, line))
        elif reason is not None and kind != "sh":
            bad.append("%s:%d: 'not run' above a %s block: only sh blocks run" % (path, line, kind))
    return bad


def script_of(path, repo):
    """The page's runnable sh blocks as one bash script, each announced."""
    parts = ["set -eo pipefail"]
    rel = os.path.relpath(path, repo)
    for line, kind, text, reason in blocks(path):
        if kind != "sh" or reason is not None:
            continue
        parts.append("echo '@@doctest %s:%d' >&2" % (rel, line))
        parts.append(text)
    return "\n".join(parts) + "\n", (len(parts) - 1) // 2


def scratch(work, name, repo, fsdpc):
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "build"))
    os.makedirs(os.path.join(d, ".bin"))
    for sub in ("examples", "scripts"):
        os.symlink(os.path.join(repo, sub), os.path.join(d, sub))
    os.symlink(fsdpc, os.path.join(d, "build", "fsdpc"))
    os.symlink(fsdpc, os.path.join(d, ".bin", "fsdpc"))
    return d


def run_page(path, repo, fsdpc, work):
    text, n = script_of(path, repo)
    rel = os.path.relpath(path, repo)
    if n == 0:
        return 0, 0.0
    d = scratch(work, re.sub(r"[^A-Za-z0-9]", "_", rel), repo, fsdpc)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}
    env.update(PATH=os.path.join(d, ".bin") + ":/usr/bin:/bin:/usr/sbin:/sbin",
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", HOME=d)
    t0 = time.time()
    try:
        p = subprocess.run(["bash", "-c", text], cwd=d, env=env, capture_output=True, text=True,
                           timeout=PAGE_SECONDS)
    except subprocess.TimeoutExpired as e:
        last = re.findall(r"@@doctest (\S+)", (e.stderr or b"").decode("utf-8", "replace"))
        raise SystemExit("FAILED %s: the page's commands ran past %d s (in the block at %s)"
                         % (rel, PAGE_SECONDS, last[-1] if last else "?"))
    if p.returncode != 0:
        where = re.findall(r"@@doctest (\S+)", p.stderr)
        out = (p.stdout[-1500:] + "\n" + p.stderr[-2500:]).strip()
        raise SystemExit("FAILED %s: exit %d in the block at %s\n%s"
                         % (rel, p.returncode, where[-1] if where else "?", out))
    return n, time.time() - t0


def main(argv):
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv and argv[0] == "--list":
        repo = os.path.abspath(argv[1])
        for path in pages(repo, argv[2:]):
            for line, kind, _, reason in blocks(path):
                state = "runs" if kind == "sh" and reason is None else \
                    ("not run: " + reason if kind == "sh" else kind or "BARE")
                print("%s:%d: %s" % (os.path.relpath(path, repo), line, state))
        return 0
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    fsdpc, repo, work = os.path.abspath(argv[0]), os.path.abspath(argv[1]), os.path.abspath(argv[2])
    os.makedirs(work, exist_ok=True)
    todo = pages(repo, argv[3:])
    bad = [b for p in todo for b in check_page(p)]
    if bad:
        raise SystemExit("FAILED:\n" + "\n".join(bad))
    ran = skipped = 0
    for path in todo:
        rel = os.path.relpath(path, repo)
        for line, kind, _, reason in blocks(path):
            if kind == "sh" and reason is not None:
                print("not run %s:%d: %s" % (rel, line, reason))
                skipped += 1
        n, secs = run_page(path, repo, fsdpc, work)
        if n:
            print("ran %s: %d blocks in %.1f s" % (rel, n, secs))
        ran += n
    if ran == 0:
        raise SystemExit("FAILED: no runnable block in %d pages" % len(todo))
    print("doctest: %d blocks ran in %d pages, %d not run (reasons above)" % (ran, len(todo), skipped))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
