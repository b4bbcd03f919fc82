"""What the hardware allows an all-reduce: the link between two GPUs as NVML describes it
(never CUDA or TensorFlow), host memory between logical CPU devices, a stated network. The
figures, their units and sources: docs/scaling.md, "What the hardware allows"."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import re
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from tfgpu._internal.helpers.checks import check_number, invalid_type, invalid_value, is_int
from tfgpu.monitor._nvml_lib import constant, decode, import_pynvml, nvml_query, start, stop

log = logging.getLogger(__name__)

GB = 1e9

# nvmlDeviceGetNvLinkVersion answers an `nvmlNvlinkVersion_t`, not the generation (nvml.h;
# hwloc issue #658: an A100 answers 5, NVLink 3.1): the enum's value -> the generation.
NVLINK_GENERATION = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}

# GB/s per link per direction by generation (NVIDIA's whitepapers; sources in docs/); a newer
# generation counts at the newest figure here (a lower bound).
NVLINK_GB_S = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}
# When NVML does not say the version: the slowest generation's figure, said in the text.
NVLINK_UNKNOWN_GB_S = 20.0

# PCIe per lane per direction: the transfer rate (GT/s) and the line encoding (PCI-SIG).
PCIE_RATE = {1: (2.5, 8 / 10), 2: (5.0, 8 / 10), 3: (8.0, 128 / 130),
             4: (16.0, 128 / 130), 5: (32.0, 128 / 130), 6: (64.0, 242 / 256)}  # fmt: skip
# When NVML says neither: Gen3 x16, the slot of every data-center GPU since 2016 (P100).
PCIE_ASSUMED = (3, 16)

# Without peer-to-peer access the data is staged through host memory: NCCL's shared-memory
# transport measures about half the peer-to-peer figure.
WITHOUT_P2P_SHARE = 0.5

# Logical CPU devices: one core's large memcpy on a current server, the conservative end.
HOST_MEMORY_BYTES_S = 10e9

# nvml.h's `nvmlGpuTopologyLevel_t`: the closest common ancestor of two GPUs.
TOPOLOGY = {"INTERNAL": 0, "SINGLE": 10, "MULTIPLE": 20, "HOSTBRIDGE": 30, "NODE": 40, "SYSTEM": 50}
# NVML_NVLINK_DEVICE_TYPE_GPU, _IBMNPU, _SWITCH: what an NVLink leads to (nvml.h).
DEVICE_TYPE_GPU, DEVICE_TYPE_IBMNPU, DEVICE_TYPE_SWITCH = 0x00, 0x01, 0x02


@dataclasses.dataclass(frozen=True)
class Link:
    """A link between devices, as an all-reduce ring between two of them would see it.

    Attributes:
        kind: str, `"nvlink"`, `"pcie"`, `"host memory"` or `"network"`.
        description: str, for people, e.g. `"PCIe Gen4 x16 with peer-to-peer access (31.5
            GB/s each way)"`.
        bandwidth_bytes_s: float, bytes per second per direction a ring can use.
        peer_to_peer: bool or None, whether the devices read each other's memory directly.
        facts: dict, JSON-ready, what the figure was derived from.
    """

    kind: str
    description: str
    bandwidth_bytes_s: float
    peer_to_peer: bool | None
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)


def gb_s(bytes_s: float) -> str:
    """`"450 GB/s"`, `"31.5 GB/s"`: decimal GB, as link speeds are printed."""
    value = bytes_s / GB
    return f"{value:.0f} GB/s" if value >= 100 else f"{value:.3g} GB/s"


# ---- the facts NVML gives, per GPU and per pair ------------------------------------------
@dataclasses.dataclass(frozen=True)
class NvLink:
    """One active NVLink: its `nvmlNvlinkVersion_t` and where it leads (None: not said)."""

    version: int | None
    remote_bus: tuple[int, int, int] | None
    remote_type: int | None


@dataclasses.dataclass(frozen=True)
class GpuFacts:
    """What NVML says of one GPU's links (None: not said)."""

    index: int
    bus: tuple[int, int, int] | None
    nvlinks: tuple[NvLink, ...] = ()
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    pcie_gen_current: int | None = None
    pcie_width_current: int | None = None


BUS = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.[0-7]$")


def bus_key(pci: Any) -> tuple[int, int, int] | None:
    """(domain, bus, device) of an `nvmlPciInfo_t`'s bus id (`"00000000:07:00.0"`, legacy
    `"0000:07:00.0"`); None without one."""
    match = BUS.match(decode(getattr(pci, "busId", b"")).strip().rstrip("\x00"))
    if not match:
        return None
    domain, bus, device = match.groups()
    return int(domain or "0", 16), int(bus, 16), int(device, 16)


def nvml_int(value: Any, least: int = 1) -> int | None:
    """An int NVML answered, at least `least`, else None (a count or generation of 0 means
    "not known"; an enum's 0 is a value)."""
    return int(value) if is_int(value) and value >= least else None


def read_gpu(nv: ModuleType, index: int, handle: Any) -> GpuFacts:
    """Reads one GPU's PCI bus, active NVLinks and PCIe link; a query NVML answers with an
    error (FUNCTION_NOT_FOUND: an older driver or binding; GPU_IS_LOST, ...) reads None."""

    def ask(name: str, *args: Any) -> Any:
        return nvml_query(nv, name, handle, *args, default=None)

    bus = bus_key(ask("nvmlDeviceGetPciInfo"))
    enabled = constant(nv, "NVML_FEATURE_ENABLED", 1)
    nvlinks = []
    for link in range(constant(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        state = ask("nvmlDeviceGetNvLinkState", link)
        if state is None:  # NOT_SUPPORTED: no NVLink; INVALID_ARGUMENT: past the last link
            break
        if state != enabled:
            continue
        nvlinks.append(
            NvLink(
                remote_bus=bus_key(ask("nvmlDeviceGetNvLinkRemotePciInfo", link)),
                version=nvml_int(ask("nvmlDeviceGetNvLinkVersion", link)),
                remote_type=nvml_int(ask("nvmlDeviceGetNvLinkRemoteDeviceType", link), 0),
            )
        )
    return GpuFacts(
        index=index,
        bus=bus,
        nvlinks=tuple(nvlinks),
        pcie_gen_max=nvml_int(ask("nvmlDeviceGetMaxPcieLinkGeneration")),
        pcie_width_max=nvml_int(ask("nvmlDeviceGetMaxPcieLinkWidth")),
        pcie_gen_current=nvml_int(ask("nvmlDeviceGetCurrPcieLinkGeneration")),
        pcie_width_current=nvml_int(ask("nvmlDeviceGetCurrPcieLinkWidth")),
    )


# ---- the decision: pure, from the facts ------------------------------------------------
def nvlinks_between(
    a: GpuFacts, b: GpuFacts, gpu_buses: set[tuple[int, int, int]]
) -> tuple[int, str, list[int]]:
    """How many NVLinks carry traffic between `a` and `b`; how (`"direct"`, `"nvswitch"`,
    `"mixed"`, or `"unknown"`: NVML does not say where they lead, and they are assumed to
    reach the peer); and the `nvmlNvlinkVersion_t` of those links."""

    def where(link: NvLink, peer: GpuFacts) -> str:
        if link.remote_type == DEVICE_TYPE_SWITCH:
            return "nvswitch"
        if link.remote_type == DEVICE_TYPE_IBMNPU:
            return "cpu"
        if link.remote_bus is None:
            return "unknown"
        if link.remote_bus == peer.bus:
            return "direct"
        if link.remote_bus in gpu_buses or link.remote_type == DEVICE_TYPE_GPU:
            return "other gpu"
        return "nvswitch"  # a PCI device that is no GPU and no CPU: a switch

    ends_a = [where(link, b) for link in a.nvlinks]
    ends_b = [where(link, a) for link in b.nvlinks]
    direct = max(ends_a.count("direct"), ends_b.count("direct"))
    switched = min(ends_a.count("nvswitch"), ends_b.count("nvswitch"))
    if direct or switched:
        used = {"direct", "nvswitch"}
        how = "direct" if direct and not switched else "nvswitch" if not direct else "mixed"
        count = direct + switched
    else:
        used, how = {"unknown"}, "unknown"
        count = min(ends_a.count("unknown"), ends_b.count("unknown"))
    versions = [
        link.version
        for links, ends in ((a.nvlinks, ends_a), (b.nvlinks, ends_b))
        for link, end in zip(links, ends)
        if end in used and link.version is not None
    ]
    return count, how, versions


def ancestor_name(ancestor: int | None) -> str | None:
    """`"SYSTEM"` for NVML_TOPOLOGY_SYSTEM, ...; None when unknown."""
    return next((name for name, value in TOPOLOGY.items() if value == ancestor), None)


def _least(*values: int | None) -> int | None:
    """The smallest of the values NVML answered (None: none)."""
    return min((v for v in values if v is not None), default=None)


def nvlink_generation(version: int) -> int | None:
    """The NVLink generation of an `nvmlNvlinkVersion_t`; a value newer than this table
    counts as the newest generation it knows (a lower bound); None for INVALID (0)."""
    if version in NVLINK_GENERATION:
        return NVLINK_GENERATION[version]
    return max(NVLINK_GENERATION.values()) if version > max(NVLINK_GENERATION) else None


def nvlink_link(
    a: GpuFacts, b: GpuFacts, count: int, how: str, versions: list[int], p2p: bool | None
) -> Link:
    generation = _least(*map(nvlink_generation, versions))
    if generation is None:
        per_link = NVLINK_UNKNOWN_GB_S
        name = "NVLink (version not reported)"
    else:
        per_link = NVLINK_GB_S.get(generation, NVLINK_GB_S[max(NVLINK_GB_S)])
        name = f"NVLink {generation}"
    bandwidth = count * per_link * GB
    route = {"nvswitch": " through NVSwitch", "mixed": " (direct and through NVSwitch)"}
    assumed = "" if generation else f", at NVLink 1's {per_link:g} GB/s per link"
    text = f"{name}, {count} link{'s' if count != 1 else ''}{route.get(how, '')}"
    text += f" ({gb_s(bandwidth)} each way{assumed})"
    if how == "unknown":
        text += "; NVML does not say where the links lead: assumed to the other GPU"
    return Link(
        kind="nvlink",
        description=text,
        bandwidth_bytes_s=bandwidth,
        peer_to_peer=p2p,
        facts={
            "gpus": [a.index, b.index],
            "nvlink_generation": generation,
            "nvlink_version_enum": _least(*versions),
            "links": count,
            "route": how,
            "per_link_gb_s": per_link,
        },
    )


def pcie_link(
    a: GpuFacts, b: GpuFacts, p2p: bool | None, ancestor: int | None, note: str = ""
) -> Link:
    gen_max = _least(a.pcie_gen_max, b.pcie_gen_max)
    width_max = _least(a.pcie_width_max, b.pcie_width_max)
    gen, width = gen_max or PCIE_ASSUMED[0], width_max or PCIE_ASSUMED[1]
    rate, encoding = PCIE_RATE.get(gen, PCIE_RATE[max(PCIE_RATE)])
    link_bytes_s = rate * encoding / 8 * width * GB
    name = f"PCIe Gen{gen} x{width}"
    if gen_max is None or width_max is None:
        said = [part for part, told in (("generation", gen_max), ("width", width_max)) if not told]
        name += f" ({' and '.join(said)} not reported: assumed)"
    bandwidth = link_bytes_s if p2p is not False else link_bytes_s * WITHOUT_P2P_SHARE
    across = ancestor == TOPOLOGY["SYSTEM"]
    if p2p is True:
        text = f"{name} with peer-to-peer access"
        text += " across CPU sockets" if across else ""
    elif p2p is False:
        text = f"{name} without peer-to-peer access, through host memory"
        text += " and the CPU interconnect (across CPU sockets)" if across else ""
    else:
        text = f"{name}, peer-to-peer access not reported"
        text += ", across CPU sockets" if across else ""
    text += f" ({gb_s(bandwidth)} each way"
    text += f", half the link's {gb_s(link_bytes_s)})" if p2p is False else ")"
    currents = [
        (g, w)
        for g, w, gm, wm in (
            (a.pcie_gen_current, a.pcie_width_current, a.pcie_gen_max, a.pcie_width_max),
            (b.pcie_gen_current, b.pcie_width_current, b.pcie_gen_max, b.pcie_width_max),
        )
        if g is not None and w is not None and (g < (gm or g) or w < (wm or w))
    ]
    if currents:
        g, w = min(currents)
        text += f"; now at Gen{g} x{w} (GPUs lower the link when idle)"
    if note:
        text += f"; {note}"
    return Link(
        kind="pcie",
        description=text,
        bandwidth_bytes_s=bandwidth,
        peer_to_peer=p2p,
        facts={
            "gpus": [a.index, b.index],
            "pcie_generation": gen_max,
            "pcie_width": width_max,
            "pcie_generation_current": _least(a.pcie_gen_current, b.pcie_gen_current),
            "pcie_width_current": _least(a.pcie_width_current, b.pcie_width_current),
            "link_bytes_s": link_bytes_s,
            "common_ancestor": ancestor_name(ancestor),
        },
    )


def pair_link(
    a: GpuFacts,
    b: GpuFacts,
    *,
    p2p: bool | None,
    ancestor: int | None,
    gpu_buses: set[tuple[int, int, int]],
) -> Link:
    """NVLink where links join the GPUs (and peer-to-peer access is not refused), else PCIe."""
    count, how, versions = nvlinks_between(a, b, gpu_buses)
    if count and p2p is not False:
        link = nvlink_link(a, b, count, how, versions, p2p)
        facts = dict(link.facts, common_ancestor=ancestor_name(ancestor))
        return dataclasses.replace(link, facts=facts)
    note = "NVLink joins them but peer-to-peer access is off" if count else ""
    return pcie_link(a, b, p2p, ancestor, note)


# ---- the effects: NVML ------------------------------------------------------------------
INDICES_EXPECTED = "None (all GPUs) or a list of NVML GPU indices (ints), e.g. [0, 1]"


def check_indices(indices: Any) -> list[int] | None:
    """The form of `indices` (their range is checked against NVML's count later)."""
    if indices is None:
        return None
    if isinstance(indices, (str, bytes)) or not isinstance(indices, Sequence):
        raise invalid_type("indices", indices, INDICES_EXPECTED)
    checked: list[int] = []
    for index in indices:
        if not is_int(index):
            raise invalid_type("indices", list(indices), INDICES_EXPECTED)
        if index < 0:
            raise invalid_value("indices", list(indices), "non-negative NVML GPU indices")
        if int(index) not in checked:
            checked.append(int(index))
    return checked


def read_links(nv: ModuleType, chosen: list[int] | None) -> Link | None:
    """The slowest pair's link among `chosen` (None: all), read from a started NVML."""
    count = nvml_query(nv, "nvmlDeviceGetCount", default=None)
    if not is_int(count):
        return None
    if chosen is not None and any(index >= count for index in chosen):
        raise invalid_value(
            "indices", chosen, f"NVML GPU indices below {count} (the GPUs NVML lists)"
        )
    chosen = list(range(count)) if chosen is None else chosen
    if len(chosen) < 2:
        return None
    handles = {
        i: nvml_query(nv, "nvmlDeviceGetHandleByIndex", i, default=None) for i in range(count)
    }
    if any(handles[index] is None for index in chosen):
        return None  # a lost or inaccessible GPU: nothing to say of its links
    try:
        facts = {i: read_gpu(nv, i, handle) for i, handle in handles.items() if handle is not None}
        buses = {f.bus for f in facts.values() if f.bus is not None}
        read = constant(nv, "NVML_P2P_CAPS_INDEX_READ", 0)
        ok = constant(nv, "NVML_P2P_STATUS_OK", 0)
        links = []
        for i, j in itertools.combinations(chosen, 2):
            pair = (handles[i], handles[j])
            status = nvml_query(nv, "nvmlDeviceGetP2PStatus", *pair, read, default=None)
            ancestor = nvml_query(nv, "nvmlDeviceGetTopologyCommonAncestor", *pair, default=None)
            p2p = None if not is_int(status) else status == ok
            ancestor = ancestor if is_int(ancestor) else None
            links.append(pair_link(facts[i], facts[j], p2p=p2p, ancestor=ancestor, gpu_buses=buses))
    except Exception as e:  # the boundary of "never raises": a binding broken in any way
        log.warning("NVML could not describe the links between GPUs (%s).", decode(e))
        return None
    link = min(links, key=lambda link: link.bandwidth_bytes_s)  # the one a ring waits on
    if len(chosen) > 2:
        link = dataclasses.replace(link, facts=dict(link.facts, pairs=len(links)))
    return link


# ---- the public functions ----------------------------------------------------------------
def gpu_link(indices: Sequence[int] | None = None) -> Link | None:
    """The slowest link between any two of the GPUs of NVML `indices` (None: all), as an
    all-reduce ring sees it; None when NVML is missing, lists or is given fewer than 2 GPUs,
    or cannot open one. NVML errors never escape; a wrong `indices` raises."""
    chosen = check_indices(indices)
    nv, _ = import_pynvml()
    if nv is None or start(nv) is not None:
        return None
    try:
        return read_links(nv, chosen)
    finally:
        stop(nv)


def network_link(gbit_s: float) -> Link:
    """A stated network between machines, `gbit_s` per direction (as NICs are sold)."""
    rate = check_number("gbit_s", gbit_s, minimum=0, exclusive_minimum=True)
    bandwidth = rate * 1e9 / 8
    return Link(
        kind="network",
        description=f"Network, {rate:g} Gb/s ({gb_s(bandwidth)} each way)",
        bandwidth_bytes_s=bandwidth,
        peer_to_peer=None,
        facts={"gbit_s": rate},
    )


def host_link(bandwidth_bytes_s: float | None = None) -> Link:
    """Host memory, shared by logical CPU devices: `bandwidth_bytes_s` as measured, else
    `HOST_MEMORY_BYTES_S` assumed; peer to peer (one address space)."""
    measured = check_number(
        "bandwidth_bytes_s", bandwidth_bytes_s, minimum=0, exclusive_minimum=True, allow_none=True
    )
    bandwidth = HOST_MEMORY_BYTES_S if measured is None else measured
    how = "assumed" if measured is None else "measured"
    return Link(
        kind="host memory",
        description=f"Host memory shared by logical CPU devices ({gb_s(bandwidth)} each way, {how})",
        bandwidth_bytes_s=bandwidth,
        peer_to_peer=True,
        facts={"bandwidth_bytes_s": bandwidth, "measured": measured is not None},
    )
