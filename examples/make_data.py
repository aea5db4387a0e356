"""Demo data: y = sin(x . a) + 0.5 tanh(x . b), x ~ N(0, 1)^16, as .npy files.

    python3 examples/make_data.py OUTDIR [ROWS]
"""
import os
import sys

import numpy as np

out = sys.argv[1]
rows = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(0)
a, b = rng.standard_normal(16) / 4, rng.standard_normal(16) / 4
x = rng.standard_normal((rows, 16)).astype(np.float32)
y = (np.sin(x @ a) + 0.5 * np.tanh(x @ b)).astype(np.float32)[:, None]
np.save(os.path.join(out, "x.npy"), x)
np.save(os.path.join(out, "y.npy"), y)
print("wrote %d rows to %s/x.npy, y.npy" % (rows, out))
