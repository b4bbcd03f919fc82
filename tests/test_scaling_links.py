"""What the hardware allows an all-reduce (issue 26): the link between GPUs read from the
scripted NVML of `tests/fake_pynvml.py` (NVLink, PCIe with and without peer-to-peer access,
across CPU sockets, drivers that say less), a stated network, host memory.
"""

from __future__ import annotations

import json
import logging
import math
import sys

import numpy as np
import pytest

from tests import fake_pynvml
from tfgpu.scalability import _links

GEN4_X16 = 16e9 * 128 / 130 / 8 * 16  # 31.5 GB/s each way


@pytest.fixture
def install(monkeypatch):
    """Installs a fake NVML built by `fake_pynvml.make(*args, **kwargs)`; returns it."""

    def install(*args, **kwargs):
        fake = fake_pynvml.make(*args, **kwargs)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    return install


def test_an_h100_board_is_18_nvlink_4_links_through_nvswitch(install):
    fake = install(fake_pynvml.machine(2, nvlinks=fake_pynvml.nvswitch_links(18)))

    link = _links.gpu_link()

    assert link.kind == "nvlink"
    assert link.bandwidth_bytes_s == 450e9
    assert link.peer_to_peer is True
    assert link.description == "NVLink 4, 18 links through NVSwitch (450 GB/s each way)"
    assert link.facts["links"] == 18 and link.facts["nvlink_generation"] == 4
    assert json.loads(json.dumps(link.facts)) == link.facts
    assert fake.init_count == 0  # NVML shut down as often as started


def test_nvlink_versions_are_nvml_enum_values_not_generations(install):
    # An A100 answers NVML_NVLINK_VERSION_3_0 (4): NVLink 3, 12 links, 300 GB/s each way.
    version = fake_pynvml.NVML_NVLINK_VERSION_3_0
    install(fake_pynvml.machine(2, nvlinks=fake_pynvml.nvswitch_links(12, version=version)))

    link = _links.gpu_link([0, 1])

    assert link.bandwidth_bytes_s == 300e9
    assert link.description.startswith("NVLink 3, 12 links")


def test_direct_links_count_only_those_that_reach_the_other_gpu(install):
    # A DGX-1-like mesh of V100s: GPU 0 has 1 link to GPU 1 and 2 links to GPU 2.
    v2 = fake_pynvml.NVML_NVLINK_VERSION_2_0
    gpus = fake_pynvml.machine(3)
    gpus[0].nvlinks = fake_pynvml.direct_links(1, fake_pynvml.bus(1), v2) + (
        fake_pynvml.direct_links(2, fake_pynvml.bus(2), v2)
    )
    gpus[1].nvlinks = fake_pynvml.direct_links(1, fake_pynvml.bus(0), v2)
    gpus[2].nvlinks = fake_pynvml.direct_links(2, fake_pynvml.bus(0), v2)
    install(gpus)

    one = _links.gpu_link([0, 1])
    two = _links.gpu_link([0, 2])

    assert one.description == "NVLink 2, 1 link (25 GB/s each way)"
    assert two.description == "NVLink 2, 2 links (50 GB/s each way)"
    assert two.facts["route"] == "direct"


def test_pcie_gen4_x16_with_peer_to_peer(install):
    install(fake_pynvml.machine(2))  # no NVLink; P2P OK, one host bridge

    link = _links.gpu_link()

    assert link.kind == "pcie"
    assert link.bandwidth_bytes_s == pytest.approx(GEN4_X16)
    assert link.peer_to_peer is True
    assert link.description == "PCIe Gen4 x16 with peer-to-peer access (31.5 GB/s each way)"
    assert link.facts["pcie_generation"] == 4 and link.facts["pcie_width"] == 16
    assert link.facts["common_ancestor"] == "HOSTBRIDGE"


def test_pcie_without_peer_to_peer_goes_through_host_memory_at_half_the_link(install):
    # The fake keeps nvidia-ml-py's NVML_P2P_CAPS_INDEX_READ = (0,), which ctypes refuses:
    # the status is only read when the index is passed as the int it stands for.
    install(fake_pynvml.machine(2), p2p=fake_pynvml.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED)

    link = _links.gpu_link()

    assert link.kind == "pcie"
    assert link.peer_to_peer is False
    assert link.bandwidth_bytes_s == pytest.approx(GEN4_X16 / 2)
    assert link.description == (
        "PCIe Gen4 x16 without peer-to-peer access, through host memory "
        "(15.8 GB/s each way, half the link's 31.5 GB/s)"
    )


def test_two_sockets_say_the_cpu_interconnect(install):
    install(
        fake_pynvml.machine(2),
        topology=fake_pynvml.NVML_TOPOLOGY_SYSTEM,
        p2p=fake_pynvml.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED,
    )

    link = _links.gpu_link()

    assert link.peer_to_peer is False
    assert link.bandwidth_bytes_s == pytest.approx(GEN4_X16 / 2)
    assert "through host memory and the CPU interconnect (across CPU sockets)" in (link.description)
    assert link.facts["common_ancestor"] == "SYSTEM"


def test_the_max_link_is_what_the_hardware_allows_and_a_lower_current_one_is_said(install):
    install(fake_pynvml.machine(2, pcie_gen_max=5, pcie_gen_current=1))

    link = _links.gpu_link()

    assert link.bandwidth_bytes_s == pytest.approx(2 * GEN4_X16)  # Gen5 x16: 63 GB/s
    assert link.description.startswith("PCIe Gen5 x16 with peer-to-peer access (63 GB/s")
    assert "now at Gen1 x16 (GPUs lower the link when idle)" in link.description
    assert link.facts["pcie_generation_current"] == 1


def test_the_narrower_of_the_two_slots_decides(install):
    gpus = fake_pynvml.machine(2)
    gpus[1].pcie_gen_max, gpus[1].pcie_width_max = 3, 8
    install(gpus)

    link = _links.gpu_link()

    assert link.description.startswith("PCIe Gen3 x8 ")
    assert link.bandwidth_bytes_s == pytest.approx(8e9 * 128 / 130 / 8 * 8)


def test_nvlink_not_supported_falls_back_to_pcie(install):
    gpus = fake_pynvml.machine(2, nvlinks=fake_pynvml.nvswitch_links(18))
    gpus[1].not_supported = {"nvmlDeviceGetNvLinkState"}
    install(gpus)

    link = _links.gpu_link()

    assert link.kind == "pcie"
    assert link.bandwidth_bytes_s == pytest.approx(GEN4_X16)


def test_nvlink_without_version_or_destination_is_a_less_specific_nvlink(install):
    links = fake_pynvml.nvswitch_links(12, remote_bus=None, remote_type=None)
    gpus = fake_pynvml.machine(2, nvlinks=links)
    for gpu in gpus:
        gpu.not_supported = {"nvmlDeviceGetNvLinkVersion"}
    install(gpus)

    link = _links.gpu_link()

    assert link.kind == "nvlink"
    assert link.bandwidth_bytes_s == 12 * 20e9  # NVLink 1's figure: the slowest
    assert link.description == (
        "NVLink (version not reported), 12 links (240 GB/s each way, at NVLink 1's 20 GB/s "
        "per link); NVML does not say where the links lead: assumed to the other GPU"
    )
    assert link.facts["nvlink_generation"] is None


def test_a_link_to_a_pci_device_that_is_no_gpu_is_an_nvswitch(install):
    # A driver without nvmlDeviceGetNvLinkRemoteDeviceType: the remote bus is a switch's.
    gpus = fake_pynvml.machine(2, nvlinks=fake_pynvml.nvswitch_links(18, remote_type=None))
    install(gpus, driver_lacks=["nvmlDeviceGetNvLinkRemoteDeviceType"])

    link = _links.gpu_link()

    assert link.description == "NVLink 4, 18 links through NVSwitch (450 GB/s each way)"


def test_nvlink_with_peer_to_peer_off_is_used_as_pcie_and_said(install):
    install(
        fake_pynvml.machine(2, nvlinks=fake_pynvml.nvswitch_links(18)),
        p2p=fake_pynvml.NVML_P2P_STATUS_DISABLED_BY_REGKEY,
    )

    link = _links.gpu_link()

    assert link.kind == "pcie"
    assert link.bandwidth_bytes_s == pytest.approx(GEN4_X16 / 2)
    assert link.description.endswith("; NVLink joins them but peer-to-peer access is off")


def test_a_binding_without_pcie_p2p_or_topology_queries_says_what_it_assumed(install):
    fake = install(fake_pynvml.machine(2))
    for name in (
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetP2PStatus",
        "nvmlDeviceGetTopologyCommonAncestor",
    ):
        delattr(fake, name)

    link = _links.gpu_link()

    assert link.kind == "pcie"
    assert link.peer_to_peer is None
    assert link.bandwidth_bytes_s == pytest.approx(8e9 * 128 / 130 / 8 * 16)  # Gen3 x16
    assert link.description == (
        "PCIe Gen3 x16 (generation and width not reported: assumed), peer-to-peer access "
        "not reported (15.8 GB/s each way)"
    )
    assert link.facts["pcie_generation"] is None and link.facts["common_ancestor"] is None


def test_indices_choose_the_gpus_and_the_slowest_pair_among_them_counts(install):
    # 0-1 joined by 4 NVLink 3 links; 2 on PCIe; 3 across the socket link from all.
    gpus = fake_pynvml.machine(4)
    v3 = fake_pynvml.NVML_NVLINK_VERSION_3_0
    gpus[0].nvlinks = fake_pynvml.direct_links(4, fake_pynvml.bus(1), v3)
    gpus[1].nvlinks = fake_pynvml.direct_links(4, fake_pynvml.bus(0), v3)
    status = fake_pynvml.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED
    system = fake_pynvml.NVML_TOPOLOGY_SYSTEM
    install(
        gpus,
        p2p={(0, 3): status, (1, 3): status, (2, 3): status},
        topology={(0, 3): system, (1, 3): system, (2, 3): system},
    )

    pair = _links.gpu_link([1, 0])
    three = _links.gpu_link([0, 1, 2])
    every = _links.gpu_link()

    assert pair.kind == "nvlink" and pair.bandwidth_bytes_s == 100e9
    assert three.kind == "pcie" and three.peer_to_peer is True
    assert three.bandwidth_bytes_s == pytest.approx(GEN4_X16)
    assert three.facts["gpus"] == [0, 2] and three.facts["pairs"] == 3
    assert every.peer_to_peer is False and every.facts["gpus"] == [0, 3]
    assert every.facts["pairs"] == 6


def test_no_link_without_nvml_or_without_two_gpus(install, monkeypatch):
    install(fake_pynvml.machine(1))
    assert _links.gpu_link() is None
    install(fake_pynvml.machine(2))
    assert _links.gpu_link([1]) is None
    install(fake_pynvml.machine(2), library_missing=True)  # no driver
    assert _links.gpu_link() is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no nvidia-ml-py
    assert _links.gpu_link() is None


def test_a_lost_gpu_gives_no_link_and_nvml_is_shut_down(install):
    gpus = fake_pynvml.machine(2, nvlinks=fake_pynvml.nvswitch_links(18))
    gpus[1].lost = True
    fake = install(gpus)

    assert _links.gpu_link() is None
    assert fake.init_count == 0


def test_a_binding_failing_unexpectedly_gives_no_link_and_a_warning(install, caplog):
    fake = install(fake_pynvml.machine(2))

    def broken(*args):
        raise RuntimeError("a broken binding")

    fake.nvmlDeviceGetNvLinkState = broken
    with caplog.at_level(logging.WARNING):
        assert _links.gpu_link() is None
    assert "a broken binding" in caplog.text
    assert fake.init_count == 0


def test_indices_are_checked(install):
    install(fake_pynvml.machine(2))
    with pytest.raises(TypeError, match=r"argument `indices`.*Received: indices='01'"):
        _links.gpu_link("01")
    with pytest.raises(TypeError, match="`indices`"):
        _links.gpu_link([0, 1.0])
    with pytest.raises(ValueError, match=r"`indices`.*non-negative"):
        _links.gpu_link([-1, 0])
    with pytest.raises(ValueError, match=r"`indices`.*below 2"):
        _links.gpu_link([0, 2])
    assert _links.gpu_link([np.int64(0), np.int64(1)]).kind == "pcie"


def test_network_link_arithmetic():
    link = _links.network_link(100)

    assert link.kind == "network"
    assert link.bandwidth_bytes_s == 12.5e9
    assert link.peer_to_peer is None
    assert link.description == "Network, 100 Gb/s (12.5 GB/s each way)"
    assert _links.network_link(np.float32(25)).bandwidth_bytes_s == 3.125e9
    assert _links.network_link(400.0).bandwidth_bytes_s == 50e9


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0, ValueError),
        (-10, ValueError),
        (math.inf, ValueError),
        (math.nan, ValueError),
        ("100", TypeError),
        (True, TypeError),
        (None, TypeError),
    ],
)
def test_network_link_checks_its_argument(value, error):
    with pytest.raises(error, match=r"argument `gbit_s`.*Expected a finite number > 0"):
        _links.network_link(value)


def test_host_link_default_and_measured():
    default = _links.host_link()
    measured = _links.host_link(bandwidth_bytes_s=4e9)

    assert default.kind == "host memory" and default.bandwidth_bytes_s == 10e9
    assert default.description.endswith("(10 GB/s each way, assumed)")
    assert measured.bandwidth_bytes_s == 4e9
    assert measured.description.endswith("(4 GB/s each way, measured)")
    assert measured.facts == {"bandwidth_bytes_s": 4e9, "measured": True}
    with pytest.raises(ValueError, match="`bandwidth_bytes_s`"):
        _links.host_link(0)
    with pytest.raises(TypeError, match="`bandwidth_bytes_s`"):
        _links.host_link("fast")


def test_a_newer_nvlink_than_the_table_counts_as_the_newest_known(install):
    install(fake_pynvml.machine(2, nvlinks=fake_pynvml.nvswitch_links(18, version=9)))

    link = _links.gpu_link()

    assert link.description.startswith("NVLink 6, 18 links through NVSwitch (900 GB/s")
