"""tfgpu._internal.adapters.devices: TensorFlow's /GPU:k -> CUDA ordinal -> NVML record, one answer for all.

The machine here is a fake NVML with three different GPUs and a shuffled
`CUDA_VISIBLE_DEVICES`; TensorFlow's device list is scripted (this CPU stands in), either
through `devices.physical_gpus` (the one place it is read) or through `tf.config` itself.
"""

from __future__ import annotations

import sys

import pytest

from tests import fake_pynvml
from tests.conftest import run_python
from tfgpu import flops
from tfgpu._internal.adapters import devices
from tfgpu._internal.adapters.devices import PhysicalGpu
from tfgpu.monitor import Sampler

# NVML (PCI-bus) order: an A100 80GB, a V100 16GB, an H100 80GB.
# The H100's memory tells the two 80 GB GPUs apart.
A100, V100 = fake_pynvml.two_gpus()
H100 = fake_pynvml.hopper(pci_bus_id="00000000:0F:00.0", memory_total_mib=81559.0)


@pytest.fixture
def machine(monkeypatch):
    """Three GPUs in NVML; `CUDA_VISIBLE_DEVICES="2,0"`: CUDA's 0 is the H100, 1 the A100."""
    module = fake_pynvml.make([A100, V100, H100])
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    return module


def _tf_lists(monkeypatch, visible, *, logical=None, cc=None):
    """TensorFlow lists CUDA's GPUs 0 and 1 and uses those in `visible`."""
    logical = logical or {}
    gpus = [
        PhysicalGpu(
            cuda_index=i,
            tf_name=f"/physical_device:GPU:{i}",
            device_name=None,
            compute_capability=cc,
            visible=i in visible,
            logical_devices=logical.get(i, 1) if i in visible else 0,
        )
        for i in range(2)
    ]
    monkeypatch.setattr(devices, "physical_gpus", lambda: gpus)


def _first_gpu_everywhere() -> dict[str, object]:
    """What each way of asking says `/GPU:0` is (by NVML index, or name and memory)."""
    record = devices.gpu_record(0)
    assert record is not None
    sampler = Sampler(interval=0.1, gpus=devices.cuda_indices(), host=False)
    return {
        "gpu_record": record.nvml_index,
        "tf_gpus": devices.tf_gpus()[0].nvml_index,
        "nvml_indices": devices.nvml_indices()[0],
        "sampler": sampler.gpus[0].index,
    }


def test_without_tensorflow_s_list_cuda_s_order_stands_in(machine, monkeypatch):
    monkeypatch.setattr(devices, "physical_gpus", lambda: [])  # TF not imported / CPU build
    gpus = devices.tf_gpus()
    assert [(g.position, g.cuda_index, g.nvml_index) for g in gpus] == [(0, 0, 2), (1, 1, 0)]
    assert [g.tf_name for g in gpus] == [None, None]
    first = devices.gpu_record(0)
    assert first is not None and first.name == H100.name
    assert first.memory_total_bytes == int(81559.0 * 2**20)
    assert first.compute_capability == (9, 0)  # NVML's, TensorFlow gave none
    assert devices.nvml_indices() == [2, 0]
    assert devices.cuda_indices() is None and devices.cuda_indices([1]) == [1]
    assert set(_first_gpu_everywhere().values()) == {2}
    assert devices.gpu_record(2) is None


@pytest.mark.parametrize(
    "cvd",
    [
        "2,0",
        # the same GPUs named by UUID prefix, as `nvidia-smi -L` prints them
        f"{H100.uuid[:12]},{A100.uuid}",
    ],
)
def test_every_way_of_asking_names_the_same_gpu_for_gpu_0(machine, monkeypatch, cvd):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cvd)
    _tf_lists(monkeypatch, visible=[0, 1])
    assert _first_gpu_everywhere() == dict.fromkeys(
        ("gpu_record", "tf_gpus", "nvml_indices", "sampler"), 2
    )
    # tfgpu.configure(gpus=[1]) hides CUDA's 0 (the H100) from TensorFlow: /GPU:0 is the A100.
    _tf_lists(monkeypatch, visible=[1])
    assert _first_gpu_everywhere() == dict.fromkeys(
        ("gpu_record", "tf_gpus", "nvml_indices", "sampler"), 0
    )
    record = devices.gpu_record(0)
    assert record is not None
    assert (record.name, record.memory_total_bytes) == (A100.name, 81920 * 2**20)
    assert devices.cuda_indices() == [1] and devices.nvml_indices() == [0]
    assert devices.gpu_record(1) is None
    # The peak FLOP/s of /GPU:0, as the MFU figures compute it.
    precision = devices.peak_precision("float32", record.compute_capability, tf32_enabled=True)
    assert flops.peak_flops(str(record.name), str(precision)) == flops.peak_flops(A100.name, "tf32")


def test_gpus_are_numbered_as_tensorflow_does(machine, monkeypatch):
    _tf_lists(monkeypatch, visible=[0, 1])
    assert devices.cuda_indices([1, 0]) == [1, 0]
    assert [g.index for g in Sampler(gpus=devices.cuda_indices([1]), host=False).gpus] == [0]
    _tf_lists(monkeypatch, visible=[1])
    assert devices.cuda_indices([0]) == [1]
    with pytest.raises(ValueError, match=r"gpus=\[1\]. Expected indices below 1: TensorFlow"):
        devices.cuda_indices([1])
    with pytest.raises(TypeError, match=r"Invalid type for argument `gpus`"):
        devices.cuda_indices([0.0])  # type: ignore[list-item]
    # TensorFlow lists GPUs but hides them all: it uses none of CUDA's.
    _tf_lists(monkeypatch, visible=[])
    assert devices.tf_gpus() == [] and devices.cuda_indices() == []
    assert devices.nvml_indices() == [] and devices.gpu_record(0) is None


def test_a_gpu_split_into_logical_devices_is_one_physical_gpu(machine, monkeypatch):
    _tf_lists(monkeypatch, visible=[0, 1], logical={0: 2})
    gpus = devices.tf_gpus()
    assert [(g.position, g.cuda_index, g.nvml_index) for g in gpus] == [
        (0, 0, 2),
        (1, 0, 2),
        (2, 1, 0),
    ]
    assert devices.nvml_indices() == [2, 0] and devices.cuda_indices() == [0, 1]
    assert devices.cuda_indices([2, 1]) == [1, 0]


def test_without_nvml_tensorflow_s_details_remain(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = [PhysicalGpu(0, "/physical_device:GPU:0", "NVIDIA L4", (8, 9), True, 1)]
    monkeypatch.setattr(devices, "physical_gpus", lambda: gpus)
    record = devices.gpu_record(0)
    assert record is not None and record.nvml is None
    assert (record.name, record.compute_capability) == ("NVIDIA L4", (8, 9))
    assert record.memory_total_bytes is None and record.nvml_index is None
    assert devices.nvml_indices() == [] and devices.cuda_indices() == [0]


def test_reads_tensorflow_s_device_list_through_tf_config(machine, monkeypatch):
    import tensorflow as tf

    stand_ins = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(2)]
    physical, visible = tf.config.list_physical_devices, tf.config.get_visible_devices
    monkeypatch.setattr(
        tf.config, "list_physical_devices", lambda k=None: stand_ins if k == "GPU" else physical(k)
    )
    monkeypatch.setattr(
        tf.config, "get_visible_devices", lambda k=None: stand_ins[1:] if k == "GPU" else visible(k)
    )
    listed = devices.physical_gpus()
    assert [(p.cuda_index, p.visible, p.logical_devices) for p in listed] == [
        (0, False, 0),
        (1, True, 1),
    ]
    # These stand-ins have no device details; TensorFlow says why, and NVML fills in.
    assert all(p.error and p.device_name is None for p in listed)
    record = devices.gpu_record(0)
    assert record is not None and record.tf_name == "/physical_device:GPU:1"
    assert (record.name, record.compute_capability) == (A100.name, (8, 0))


def test_this_cpu_only_tensorflow_lists_no_gpu_and_the_runtime_state_is_read():
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("a GPU build on a GPU machine lists its GPUs")
    assert devices.physical_gpus() == []
    tf.constant(1.0) + 1.0  # any op starts the runtime (conftest configured it before)
    assert devices.tf_runtime_initialized() is True


def test_without_tensorflow_imported_nothing_imports_it(machine, monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow")
    assert devices.tf_runtime_initialized() is False
    assert devices.physical_gpus() == []
    assert devices.nvml_indices() == [2, 0]
    assert devices.tf32_execution_enabled() is True  # TensorFlow's default
    assert "tensorflow" not in sys.modules


@pytest.mark.slow
def test_importing_and_asking_needs_no_tensorflow():
    code = (
        "import sys\n"
        "from tfgpu._internal.adapters import devices\n"
        "devices.tf_gpus(); devices.nvml_indices(); devices.cuda_indices()\n"
        "print('tensorflow' in sys.modules, 'keras' in sys.modules)\n"
    )
    assert run_python(code).stdout.strip().splitlines()[-1] == "False False"


@pytest.mark.parametrize(
    "policy, ccs, tf32, expected",
    [
        ("float32", (8, 0), True, "tf32"),
        ("float32", [(8, 0), (9, 0)], True, "tf32"),
        ("float32", (8, 0), False, "float32"),  # TF32 switched off in TensorFlow
        ("float32", (7, 0), True, "float32"),  # no TF32 before Ampere
        ("float32", [(8, 0), (7, 0)], True, "float32"),  # the slowest GPU sets the pace
        ("float32", [(8, 0), None], True, "float32"),  # unknown: no TF32 assumed
        ("float32", None, True, "float32"),
        ("float32", [], True, "float32"),
        ("mixed_bfloat16", (9, 0), True, "bfloat16"),
        ("mixed_float16", (7, 5), True, "float16"),
        ("mixed_float16", [(8, 0)], False, "float16"),
        ("bfloat16", (8, 0), True, "bfloat16"),
        ("float16", (8, 0), True, "float16"),
        ("float64", (8, 0), True, None),
    ],
)
def test_peak_precision_is_one_rule(policy, ccs, tf32, expected):
    assert devices.peak_precision(policy, ccs, tf32_enabled=tf32) == expected
    if expected is not None:  # a name peak_flops accepts
        assert flops.peak_flops("NVIDIA A100-SXM4-80GB", expected) > 0


@pytest.fixture
def tf32_off():
    import tensorflow as tf

    before = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    yield
    tf.config.experimental.enable_tensor_float_32_execution(before)


def test_peak_precision_reads_tensorflow_s_tf32_switch(tf32_off):
    assert devices.tf32_execution_enabled() is False
    assert devices.peak_precision("float32", (8, 0)) == "float32"
    assert devices.peak_precision("float32", (8, 0), tf32_enabled=True) == "tf32"
