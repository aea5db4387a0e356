"""kernels.h's float16 conversions bit for bit against NumPy's float16.

usage: f16_numpy.py F16_TOOL WORKDIR

- float16 -> float32: all 65,536 bit patterns; every non-NaN result has NumPy's
  bits exactly, every NaN is a NaN of the same sign (NumPy may quiet a
  signalling NaN through the CPU's F16C, or not: the payload is not compared);
- float32 -> float16: for every finite float16 value, the float32 values at the
  halfway point to its successor (a tie: to even), one float32 ulp below and
  above it, and the value itself; float32 values from 65504 to past 65520
  (overflow to infinity), every float32 below 2^-14 on a stride (the subnormal
  halves and the underflow to zero), 2,000,000 random bit patterns of every
  class, the infinities and NaNs of both signs: NumPy's bits exactly (NaNs: a
  NaN of the same sign).
"""
import os
import subprocess
import sys

import numpy as np


def check(cond, msg):
    if not cond:
        raise SystemExit("FAILED: " + msg)


def same(got, want, what):
    """uint16 / uint32 bit arrays of a float dtype: equal, NaNs by sign only"""
    if got.dtype == np.uint16:
        gf, wf, sign = got.view(np.float16), want.view(np.float16), 0x8000
    else:
        gf, wf, sign = got.view(np.float32), want.view(np.float32), 0x80000000
    nan = np.isnan(wf)
    check(np.array_equal(np.isnan(gf), nan), "%s: NaN where NumPy has none or none where it has one" % what)
    bad = np.nonzero((got != want) & ~nan)[0]
    check(len(bad) == 0, "%s: %d values differ from NumPy, first at %d: 0x%x vs 0x%x"
          % (what, len(bad), bad[0] if len(bad) else -1, got[bad[0]] if len(bad) else 0,
             want[bad[0]] if len(bad) else 0))
    check(np.array_equal(got[nan] & sign, want[nan] & sign), "%s: a NaN's sign differs from NumPy's" % what)
    return len(got)


def main():
    tool, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    out32 = os.path.join(work, "to32.bin")
    subprocess.run([tool, "to32", out32], check=True)
    got32 = np.fromfile(out32, dtype="<u4")
    want32 = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
    n1 = same(got32, want32, "float16 -> float32")

    h = np.arange(65536, dtype=np.uint16).view(np.float16)
    fin = h[np.isfinite(h)].astype(np.float32)
    fin = fin[fin >= 0]
    with np.errstate(over="ignore"):  # 65504's successor is infinity
        nxt = np.nextafter(fin.astype(np.float16), np.float16(np.inf)).astype(np.float32)
        mid = ((fin.astype(np.float64) + nxt.astype(np.float64)) / 2).astype(np.float32)  # exact in float32
    up, down = np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf))
    top = np.arange(0x477FE000, 0x47800100, dtype=np.uint32).view(np.float32)  # 65504 .. past 65520
    sub = np.arange(0, 0x38800100, 97, dtype=np.uint32).view(np.float32)     # zero .. 2^-14, strided
    rng = np.random.default_rng(1)
    rand = rng.integers(0, 2 ** 32, 2_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    special = np.array([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 3.4028235e38, -3.4028235e38], np.float32)
    x = np.concatenate([fin, mid, up, down, top, sub, rand, special]).astype(np.float32)
    x = np.concatenate([x, -x])
    inp, out16 = os.path.join(work, "in.bin"), os.path.join(work, "to16.bin")
    x.astype("<f4").tofile(inp)
    subprocess.run([tool, "to16", inp, out16], check=True)
    got16 = np.fromfile(out16, dtype="<u2")
    with np.errstate(over="ignore"):
        want16 = x.astype(np.float16).view(np.uint16)
    check(len(got16) == len(x), "float32 -> float16: %d results for %d values" % (len(got16), len(x)))
    n2 = same(got16, want16, "float32 -> float16")
    ties = int(np.count_nonzero(mid.astype(np.float16) != fin.astype(np.float16)))
    print("OK f16_numpy: %d float16 -> float32 and %d float32 -> float16 conversions equal NumPy's "
          "(%d ties rounded up to even, the rest down)" % (n1, n2, ties))


if __name__ == "__main__":
    main()
