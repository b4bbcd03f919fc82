"""Checks `tfgpu.monitor` against real GPU loads; needs PyTorch and nvidia-ml-py, not TensorFlow.

Usage on a machine with an NVIDIA GPU (from the repository root):

    python benchmarks/gpu_check.py                  # five phases of 4 s each, about 30 s
    python benchmarks/gpu_check.py --phase 6 --out /tmp/gpu-check

With `tfgpu.monitor.record()` sampling GPU 0 every 0.1 s, runs five phases and prints each
one's means (leaving out its first second: NVML averages utilization over up to 1 s and GPM
over the time between two samples):

1. `idle`: nothing. Expected: utilization <= 10%.
2. `bf16_matmul`: back-to-back bf16 matrix multiplies. Expected: utilization >= 90% and,
   with GPM (Hopper or newer), tensor activity >= 20%.
3. `fp32_matmul`: the same in float32 with TF32 off. Expected: utilization >= 90% while
   tensor activity stays near zero (<= 5%, and below a quarter of phase 2's).
4. `tiny_kernels`: a loop of one-block kernels (`torch.cuda._sleep`, else 1-element adds).
   Expected: utilization >= 80% while SM activity stays <= 20%: what utilization hides.
5. `h2d_copy`: pinned host-to-device copies. Expected: PCIe RX >= 1000 MiB/s.

Also expected: this process's GPU memory above 0, and energy rising during the busy phases.
Then it times 20 direct samples (the sampler's cost per sample on this machine). Exit
status 0 when every expectation holds, 1 otherwise, 2 when there is no GPU, no PyTorch or
no NVML (with a message saying which).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KEYS = (
    "util_pct",
    "sm_active_pct",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "fp32_active_pct",
    "dram_active_pct",
    "pcie_tx_mib_s",
    "pcie_rx_mib_s",
    "power_w",
    "proc_sm_util_pct",
    "proc_mem_mib",
)


def _mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.fmean(finite) if finite else math.nan


def _loads(torch, size: int) -> dict[str, Callable[[], None]]:
    """One unit of work per phase; each call queues a few kernels and returns."""
    a16 = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b16 = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    c16 = torch.empty_like(a16)
    a32, b32 = a16.float(), b16.float()
    c32 = torch.empty_like(a32)
    tiny = torch.zeros(1, device="cuda")
    host = torch.empty(256 * 2**20, dtype=torch.uint8).pin_memory()
    device_buffer = torch.empty_like(host, device="cuda")
    sleep = getattr(torch.cuda, "_sleep", None)

    def bf16() -> None:
        for _ in range(10):
            torch.matmul(a16, b16, out=c16)

    def fp32() -> None:
        for _ in range(4):
            torch.matmul(a32, b32, out=c32)

    def tiny_kernels() -> None:
        if sleep is not None:
            for _ in range(20):
                sleep(1_000_000)  # one block spinning ~0.5 ms: the GPU is "100% utilized"
        else:
            for _ in range(1000):
                tiny.add_(1.0)

    def h2d() -> None:
        for _ in range(4):
            device_buffer.copy_(host, non_blocking=True)

    return {"bf16_matmul": bf16, "fp32_matmul": fp32, "tiny_kernels": tiny_kernels, "h2d_copy": h2d}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", type=float, default=4.0, help="seconds per phase")
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--out", default=None, help="run directory for run.json/timeline.csv")
    args = parser.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("gpu_check: PyTorch is not installed; nothing to load the GPU with. SKIP")
        return 2
    if not torch.cuda.is_available():
        print("gpu_check: PyTorch sees no CUDA GPU (no GPU or no driver on this machine). SKIP")
        return 2

    from tfgpu import monitor
    from tfgpu.monitor.nvml import inventory

    inv = inventory()
    if not inv.available:
        print(f"gpu_check: NVML is not available: {inv.error} SKIP")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # phase 3: float32 on the FP32 pipes
    torch.backends.cudnn.allow_tf32 = False
    loads = _loads(torch, args.size)
    torch.cuda.synchronize()
    bounds: dict[str, tuple[float, float]] = {}
    with monitor.record(args.out, interval=0.1, gpus=[0]) as run:
        gpu = run.gpus[0]
        print(f"gpu_check: sampling {gpu.name} (cc {gpu.compute_capability}, {gpu.uuid})")
        for phase in ("idle", *loads):
            run.mark(epoch=len(bounds))
            start = time.time()
            units = 0
            while time.time() - start < args.phase:
                if phase == "idle":
                    time.sleep(0.05)
                    continue
                loads[phase]()
                units += 1
                if units % 4 == 0:
                    torch.cuda.synchronize()  # keep the queue short: phases end on time
            torch.cuda.synchronize()
            bounds[phase] = (start + 1.0, time.time())

    rows = run.samples
    result: dict[str, dict[str, float]] = {}
    for phase, (lo, hi) in bounds.items():
        selected = [r for r in rows if lo <= r["time"] <= hi]
        result[phase] = {k: _mean([r[f"gpu0_{k}"] for r in selected]) for k in KEYS}
        energy = [r["gpu0_energy_j"] for r in selected if r["gpu0_energy_j"] == r["gpu0_energy_j"]]
        result[phase]["energy_j"] = energy[-1] - energy[0] if len(energy) >= 2 else math.nan
        stats = ", ".join(f"{k} {v:.1f}" for k, v in result[phase].items())
        print(f"gpu_check: {phase:12s} {len(selected):3d} samples: {stats}")

    gpm = gpu.compute_capability is not None and gpu.compute_capability >= (9, 0)
    checks: list[tuple[str, bool | None]] = []

    def check(what: str, ok: bool, needs_gpm: bool = False) -> None:
        checks.append((what, None if needs_gpm and not gpm else ok))

    r = result
    check("idle: util <= 10%", r["idle"]["util_pct"] <= 10)
    check("bf16: util >= 90%", r["bf16_matmul"]["util_pct"] >= 90)
    check("bf16: tensor activity >= 20%", r["bf16_matmul"]["tensor_active_pct"] >= 20, True)
    check("fp32 (TF32 off): util >= 90%", r["fp32_matmul"]["util_pct"] >= 90)
    check(
        "fp32 (TF32 off): tensor activity <= 5% and < bf16's / 4",
        r["fp32_matmul"]["tensor_active_pct"] <= 5
        and r["fp32_matmul"]["tensor_active_pct"] < r["bf16_matmul"]["tensor_active_pct"] / 4,
        True,
    )
    check("tiny kernels: util >= 80%", r["tiny_kernels"]["util_pct"] >= 80)
    check("tiny kernels: SM activity <= 20%", r["tiny_kernels"]["sm_active_pct"] <= 20, True)
    check("h2d copy: PCIe RX >= 1000 MiB/s", r["h2d_copy"]["pcie_rx_mib_s"] >= 1000)
    check("process GPU memory > 0", r["bf16_matmul"]["proc_mem_mib"] > 0)
    check("energy rises while busy", r["bf16_matmul"]["energy_j"] > 0)

    # The sampler's own cost on this machine: 20 samples taken directly, 0.1 s apart.
    sampler = monitor.Sampler(interval=60, gpus=[0], host=True)
    sampler.start()
    sampler._first_row.wait(30)  # the thread's first row is in: no race with it
    costs = []
    for _ in range(20):
        time.sleep(0.1)
        t0 = time.perf_counter()
        sampler._sample()
        costs.append(time.perf_counter() - t0)
    sampler.stop()
    print(
        f"gpu_check: one sample (all metrics, 1 GPU + host) takes median "
        f"{statistics.median(costs) * 1e3:.2f} ms, max {max(costs) * 1e3:.2f} ms"
    )

    for what, ok in checks:
        print(f"gpu_check: {'PASS' if ok else 'SKIP (no GPM)' if ok is None else 'FAIL'}  {what}")
    failed = [what for what, ok in checks if ok is False]
    print(f"gpu_check: {'FAIL' if failed else 'PASS'} ({len(failed)} failed)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
