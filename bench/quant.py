"""Throughput of the float32 <-> int32 quantisation (sw_driver/quant.py) with numpy.

Writes bench/results/quant.json: GB/s of float32 input per stage (exponents, quantise,
dequantise, and the whole host-side path), best of several repeats. Target: >= 1 GB/s.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from netreduce.sw_driver import quant


def best(fn, repeats=7):
    fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def main():
    n = 16 * 1024 * 1024  # 64 MiB of float32
    chunk = 16 * 1024  # one 64 KiB message per chunk (the collective's default)
    world = 8
    x = (np.random.default_rng(0).standard_normal(n) * 100).astype(np.float32)
    e = quant.scales(quant.chunk_exponents(x, chunk), world)
    q = np.empty(n, np.int32)
    y = np.empty(n, np.float32)
    quant.quantize(x, e, chunk, out=q)
    t_exp = best(lambda: quant.chunk_exponents(x, chunk))
    t_q = best(lambda: quant.quantize(x, e, chunk, out=q))
    t_dq = best(lambda: quant.dequantize(q, e, chunk, out=y))
    gb = x.nbytes / 1e9
    res = {
        "bench": "quant",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "elements": n, "bytes": x.nbytes, "chunk_elements": chunk, "world": world,
        "gbps_exponents": round(gb / t_exp, 3),
        "gbps_quantize": round(gb / t_q, 3),
        "gbps_dequantize": round(gb / t_dq, 3),
        "gbps_host_path": round(gb / (t_exp + t_q + t_dq), 3),
        "target_gbps": 1.0,
        "numpy": np.__version__, "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    out = Path(__file__).parent / "results" / "quant.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
