"""The CPU's peak FLOP/s, parsed from sample /proc/cpuinfo and cgroup texts (no TensorFlow)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tfgpu._internal.adapters import cpu
from tfgpu._internal.adapters.cpu import _peak_from_texts, _usable_cores, peak_flops

INTEL_AVX512 = """\
processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
cpu MHz\t\t: 2000.000
flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512bw avx512_bf16 avx512_fp16 amx_bf16 amx_tile

processor\t: 1
vendor_id\t: GenuineIntel
cpu MHz\t\t: 3100.000
flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512bw avx512_bf16 avx512_fp16 amx_bf16 amx_tile
"""

AMD_AVX2 = """\
processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
cpu MHz\t\t: 2445.432
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2
"""

NO_FLAGS = """\
processor\t: 0
model name\t: Some CPU
cpu MHz\t\t: 1000.000
"""

ARM = """\
processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp
"""


def test_intel_avx512_uses_the_cpufreq_max_clock_and_amx_for_bfloat16():
    # cpuinfo_max_freq (kHz) wins over the current `cpu MHz` readings.
    assert _peak_from_texts(INTEL_AVX512, 4, "3800000\n", "fp32") == 4 * 3.8e9 * 64
    assert _peak_from_texts(INTEL_AVX512, 4, "3800000\n", "bf16") == 4 * 3.8e9 * 1024
    assert _peak_from_texts(INTEL_AVX512, 4, "3800000\n", "fp16") == 4 * 3.8e9 * 128  # avx512_fp16


def test_amd_avx2_uses_the_highest_cpu_mhz_without_cpufreq():
    assert _peak_from_texts(AMD_AVX2, 2, None, "fp32") == pytest.approx(2 * 2445.432e6 * 32)
    # No 16-bit vector units: bfloat16 runs at the float32 rate.
    assert _peak_from_texts(AMD_AVX2, 2, None, "bf16") == _peak_from_texts(
        AMD_AVX2, 2, None, "fp32"
    )
    # Highest `cpu MHz` of all CPUs.
    assert _peak_from_texts(INTEL_AVX512, 1, None, "fp32") == 3100e6 * 64


def test_older_vector_units():
    sse = NO_FLAGS.replace("model name", "flags\t\t: fpu sse sse2\nmodel name")
    avx = NO_FLAGS.replace("model name", "flags\t\t: fpu sse sse2 avx\nmodel name")
    assert _peak_from_texts(sse, 1, None, "fp32") == 1e9 * 16
    assert _peak_from_texts(avx, 1, None, "fp32") == 1e9 * 16
    assert _peak_from_texts(ARM, 8, "2600000", "fp32") == 8 * 2.6e9 * 32


@pytest.mark.parametrize(
    ("cpuinfo", "cores", "max_freq"),
    [
        (NO_FLAGS, 2, "3000000"),  # no known vector flags
        (ARM, 8, None),  # no clock anywhere
        (AMD_AVX2, None, None),  # unknown cores
        ("", 2, "3000000"),
        (None, 2, "3000000"),  # unreadable
        (AMD_AVX2.replace("2445.432", "garbage"), 2, "not a number"),
    ],
)
def test_none_when_the_machine_does_not_say(cpuinfo, cores, max_freq):
    assert _peak_from_texts(cpuinfo, cores, max_freq, "fp32") is None


def test_usable_cores_from_affinity_and_cgroup_quota():
    assert _usable_cores(4, 64) == 4
    assert _usable_cores(None, 64) == 64
    assert _usable_cores(None, None) is None
    assert _usable_cores(8, 64, cgroup_v2_max="150000 100000\n") == 2  # 1.5 CPUs -> 2
    assert _usable_cores(8, 64, cgroup_v2_max="max 100000\n") == 8
    assert _usable_cores(8, 64, cgroup_v2_max="1000000 100000") == 8  # quota above affinity
    assert _usable_cores(8, 64, cfs_quota_us="-1", cfs_period_us="100000") == 8
    assert _usable_cores(8, 64, cfs_quota_us="200000\n", cfs_period_us="100000\n") == 2
    assert _usable_cores(8, 64, cgroup_v2_max="garbage") == 8


def test_peak_flops_reads_this_machine(monkeypatch, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(AMD_AVX2)
    monkeypatch.setattr(cpu, "_CPUINFO", cpuinfo)
    monkeypatch.setattr(cpu, "_MAX_FREQ", tmp_path / "missing")
    for name in ("_CGROUP_V2_MAX", "_CGROUP_V1_QUOTA", "_CGROUP_V1_PERIOD"):
        monkeypatch.setattr(cpu, name, tmp_path / "missing")
    monkeypatch.setattr(cpu.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    assert peak_flops() == pytest.approx(3 * 2445.432e6 * 32)
    assert peak_flops("mixed_bfloat16") == peak_flops("float32")
    monkeypatch.setattr(cpu, "_CPUINFO", tmp_path / "unreadable")
    assert peak_flops() is None
    monkeypatch.setattr(sys, "platform", "darwin")
    assert peak_flops() is None


def test_peak_flops_on_the_real_machine_is_a_positive_float_or_none():
    peak = peak_flops()
    assert peak is None or (isinstance(peak, float) and peak > 0)


@pytest.mark.parametrize(
    ("dtype", "error", "match"),
    [
        ("int8", ValueError, r"`dtype`. Received: dtype='int8'. Expected one of: 'float32'"),
        ("", ValueError, r"Received: dtype=''"),
        (None, TypeError, r"Received: dtype=None \(of type NoneType\). Expected a str"),
        (np.float32, TypeError, r"`dtype`"),
        (32, TypeError, r"dtype=32 \(of type int\)"),
    ],
)
def test_bad_dtype_is_rejected(dtype, error, match):
    with pytest.raises(error, match=match):
        peak_flops(dtype)
