# Measures numpy's float32 matmul (OpenBLAS) for the shapes bench-ops uses.
# argv: reps, then M,K,N triples; prints one JSON object per line: {"m","k","n","gflops"}.
import json, sys, time
import numpy as np

reps = int(sys.argv[1])
for spec in sys.argv[2:]:
    m, k, n = (int(x) for x in spec.split(","))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    a @ b
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    times.sort()
    med = times[len(times) // 2]
    print(json.dumps({"m": m, "k": k, "n": n, "gflops": 2.0 * m * k * n / med / 1e9}), flush=True)
