"""Finding PyTorch 2 for the benchmarks: the python they run its sides under (bench/gpt_cpu.py, bench/gpt_ddp.py)."""
import shutil
import subprocess


def torch2_python(given):
    """(python, torch version without its local tag) for --torch2 given, or the python3 on PATH, when it imports
    numpy and torch >= 2; (None, None) otherwise or for "none" """
    for py in [given] if given else [shutil.which("python3") or ""]:
        if not py or py == "none":
            continue
        p = subprocess.run([py, "-c", "import numpy, torch; print(torch.__version__)"], capture_output=True,
                           text=True)
        if p.returncode == 0 and int(p.stdout.split(".")[0]) >= 2:
            return py, p.stdout.strip().split("+")[0]
    return None, None
