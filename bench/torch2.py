"""Finding PyTorch 2 for the benchmarks: the python they run its sides under (bench/gpt_cpu.py, bench/gpt_ddp.py).

Without --torch2 the python3 on PATH is used when it has torch >= 2; else a virtual environment made once in
~/.cache/fsdpc-bench/torch2 (on /usr/bin/python3, or the python3 on PATH) with torch and numpy from PyPI — a large
download (torch's wheel and its CUDA libraries, a few GB), said before it starts.  --torch2 none leaves PyTorch 2
out."""
import os
import shutil
import subprocess
import sys

VENV = os.path.join(os.path.expanduser("~"), ".cache", "fsdpc-bench", "torch2")


def _version(py):
    """torch's version under py (without its local tag) when py imports numpy and torch >= 2, else None"""
    if not py or not os.path.exists(py):
        return None
    p = subprocess.run([py, "-c", "import numpy, torch; print(torch.__version__)"], capture_output=True, text=True)
    if p.returncode != 0:
        return None
    v = p.stdout.strip().split("+")[0]
    return v if int(v.split(".")[0]) >= 2 else None


def _install():
    """make the virtual environment and install torch >= 2 into it; its python"""
    py = os.path.join(VENV, "bin", "python")
    base = shutil.which("python3") or "/usr/bin/python3"
    print("installing PyTorch 2 for the benchmark (no python with torch >= 2 found; --torch2 PYTHON to give one, "
          "--torch2 none to leave it out): %s -m venv %s; pip install 'torch>=2' numpy (a download of a few GB)"
          % (base, VENV), flush=True)
    r = subprocess.run([base, "-m", "venv", VENV])
    if r.returncode != 0:
        sys.exit("bench: %s -m venv failed (Debian: apt-get install python3-venv)" % base)
    r = subprocess.run([py, "-m", "pip", "install", "-q", "torch>=2", "numpy"])
    if r.returncode != 0:
        sys.exit("bench: pip install torch failed (it needs PyPI: see pip's message above)")
    return py


def torch2_python(given):
    """(python, torch version) for --torch2 given (none: (None, None)), or the python3 on PATH when it has torch
    >= 2, or the environment in ~/.cache/fsdpc-bench/torch2, made and installed here when missing"""
    if given == "none":
        return None, None
    if given:
        v = _version(given)
        if not v:
            sys.exit("bench: --torch2 %s: no torch >= 2 (with numpy) there" % given)
        return given, v
    for py in (shutil.which("python3"), os.path.join(VENV, "bin", "python")):
        v = _version(py)
        if v:
            return py, v
    py = _install()
    v = _version(py)
    if not v:
        sys.exit("bench: torch >= 2 still does not import under %s after installing it" % py)
    print("using PyTorch %s from %s" % (v, py), flush=True)
    return py, v


def ensure_debian_torch():
    """the drivers run under Debian's python3 and import its torch (1.13, the second line, and the ONNX export):
    install python3-torch and python3-onnx with apt-get when they are missing (as root; else say what to run)"""
    if subprocess.run([sys.executable, "-c", "import numpy, torch, onnx"], capture_output=True).returncode == 0:
        return
    pkgs = ["python3-numpy", "python3-torch", "python3-onnx"]
    if sys.executable != "/usr/bin/python3" or os.geteuid() != 0:
        sys.exit("bench: run this with Debian's /usr/bin/python3 and its packages: apt-get install %s" % " ".join(pkgs))
    print("installing Debian's PyTorch for the benchmark: apt-get install %s" % " ".join(pkgs), flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + pkgs, env=env).returncode:
        sys.exit("bench: apt-get install %s failed" % " ".join(pkgs))
