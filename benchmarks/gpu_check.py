"""Checks `tfgpu.monitor` against a real GPU load; needs PyTorch and nvidia-ml-py, not TensorFlow.

Usage on a machine with an NVIDIA GPU (from the repository root):

    python benchmarks/gpu_check.py                 # idle 3 s, matmul loop 6 s, idle 3 s
    python benchmarks/gpu_check.py --busy 10 --out /tmp/gpu-check

Samples GPU 0 every 0.1 s while it first idles, then runs back-to-back large matrix
multiplies, then idles again, and prints each phase's mean utilization, memory, power and SM
clock (leaving out the first 0.5 s of each phase, as NVML averages over up to 1 s). Expected:
utilization near 100% while busy and near 0% when idle; this process's GPU memory (from
`nvmlDeviceGetComputeRunningProcesses`) above 0 once PyTorch has allocated. Exit status 0 when
both hold, 1 otherwise, 2 when there is no GPU or no PyTorch.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.fmean(finite) if finite else math.nan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=float, default=3.0)
    parser.add_argument("--busy", type=float, default=6.0)
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--out", default=None, help="run directory for run.json/timeline.csv")
    args = parser.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("gpu_check: PyTorch is not installed; nothing to load the GPU with.")
        return 2
    if not torch.cuda.is_available():
        print("gpu_check: PyTorch sees no CUDA GPU.")
        return 2
    try:
        import psutil  # noqa: F401

        host = True
    except ImportError:
        host = False

    from tfgpu.monitor import Sampler

    sampler = Sampler(interval=0.1, gpus=[0], path=args.out, host=host)
    if not sampler.gpus:
        print("gpu_check: NVML sees no GPU for this process (is nvidia-ml-py installed?).")
        return 2
    print(f"gpu_check: sampling {sampler.gpus[0].name} ({sampler.gpus[0].uuid})")
    a = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)
    torch.cuda.synchronize()
    bounds: dict[str, tuple[float, float]] = {}
    sampler.start()
    try:
        for phase, seconds in (
            ("idle_before", args.idle),
            ("busy", args.busy),
            ("idle_after", args.idle),
        ):
            sampler.mark(epoch=len(bounds))
            start = time.time()
            if phase == "busy":
                matmuls = 0
                while time.time() - start < seconds:
                    for _ in range(10):
                        torch.matmul(a, b, out=c)
                    matmuls += 10
                    torch.cuda.synchronize()
                flops = 2 * args.size**3 * matmuls / (time.time() - start)
                print(f"gpu_check: busy phase ran {matmuls} matmuls, {flops / 1e12:.1f} TFLOP/s")
            else:
                time.sleep(seconds)
            bounds[phase] = (start + 0.5, time.time())
    finally:
        sampler.stop()

    rows = sampler.samples
    result = {}
    for phase, (lo, hi) in bounds.items():
        selected = [r for r in rows if lo <= r["time"] <= hi]
        result[phase] = {
            key: _mean([r[f"gpu0_{key}"] for r in selected])
            for key in ("util_pct", "mem_util_pct", "proc_mem_mib", "power_w", "sm_clock_mhz")
        }
        stats = ", ".join(f"{k} {v:.1f}" for k, v in result[phase].items())
        print(f"gpu_check: {phase:11s} {len(selected):3d} samples: {stats}")
    busy = result["busy"]["util_pct"]
    idle = max(result["idle_before"]["util_pct"], result["idle_after"]["util_pct"])
    ok = busy >= 90 and idle <= 10 and result["busy"]["proc_mem_mib"] > 0
    print(f"gpu_check: busy {busy:.1f}% / idle {idle:.1f}% -> {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
