"""InfiniBand / RoCE port counters from sysfs, and which port serves each GPU.

Communication jitter shows on the wire before it shows in step times: congestion ticks
(``port_xmit_wait``), ECN/CNP marks, retransmits, link flaps. The kernel exposes them per port
under ``/sys/class/infiniband/<device>/ports/<n>/{counters,hw_counters}``; the root is
configurable so tests read fixture trees, as node_exporter does.

Units and widths (Linux ``Documentation/ABI/stable/sysfs-class-infiniband``):

- ``port_xmit_data`` / ``port_rcv_data`` count 4-octet words, so bytes are 4 x the value. The
  kernel shows the 64-bit extended counters where the HCA has them; a 32-bit counter wraps in
  about a third of a second at 400 Gb/s, so deltas are taken per read and a value that went
  backwards is read as a wrap (a small step back from near the top of its width) or a reset.
- ``hw_counters`` are driver specific; only a fixed, documented set is read, so a new driver
  cannot grow the label set.

A GPU's port is the one nearest to it on the PCIe tree (the longest shared path of bridges
under ``/sys/devices``), the way NCCL picks a NIC per GPU; an active port wins over a down one.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

TRAFFIC_COUNTERS = ("port_xmit_data", "port_rcv_data")
WORD_BYTES = 4
ERROR_COUNTERS = (
    "port_xmit_wait",
    "link_downed",
    "link_error_recovery",
    "symbol_error",
    "port_rcv_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)
"""Counters read from ``counters/`` besides traffic: congestion ticks, link flaps and errors."""
HW_COUNTERS = (
    "np_ecn_marked_roce_packets",
    "np_cnp_sent",
    "rp_cnp_handled",
    "out_of_sequence",
    "packet_seq_err",
    "local_ack_timeout_err",
    "roce_adp_retrans",
)
"""RoCE congestion and retransmit counters from ``hw_counters/`` (mlx5 names)."""
CONGESTION_COUNTERS = ("np_ecn_marked_roce_packets", "rp_cnp_handled")
"""Congestion notifications: packets the switches ECN-marked on arrival, CNPs that slowed our sender."""
RETRANSMIT_COUNTERS = ("out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "roce_adp_retrans")
"""Lost or reordered packets that made the sender go back (each costs a timeout or a resend)."""


@dataclass(frozen=True, slots=True)
class PortReading:
    """One read of one port: raw counter values as the kernel shows them."""

    device: str
    port: int
    link_layer: str | None
    active: bool
    rate_gbps: float | None
    pci_path: tuple[str, ...]
    """PCI addresses from the root complex down to the HCA (empty when unknown)."""
    counters: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PortTotals:
    """A port's counters as monotonic totals since the agent started, plus its current rates."""

    device: str
    port: int
    link_layer: str | None
    active: bool
    rate_gbps: float | None
    tx_bytes: float
    rx_bytes: float
    tx_bytes_per_s: float | None
    rx_bytes_per_s: float | None
    events: dict[str, float]
    """Totals of ERROR_COUNTERS and HW_COUNTERS the port has (absent ones are left out)."""
    event_deltas: dict[str, int] = field(default_factory=dict)
    """How much each of those counters grew since the previous read (empty on the first read)."""
    event_rates: dict[str, float] = field(default_factory=dict)
    """The same per second."""


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _pci_path(device_link: Path) -> tuple[str, ...]:
    """The PCI addresses on the way from the root complex to this device (``/sys/devices/...``)."""
    try:
        resolved = os.path.realpath(device_link)
    except OSError:
        return ()
    return tuple(part for part in Path(resolved).parts if _is_pci_address(part))


def _is_pci_address(part: str) -> bool:
    # 0000:18:00.0 (domain:bus:device.function)
    pieces = part.split(":")
    return len(pieces) == 3 and "." in pieces[2] and all(p for p in pieces)


def normalise_bus_id(bus_id: str) -> str:
    """NVML says ``00000000:18:00.0``, sysfs says ``0000:18:00.0``: compare in sysfs form."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else bus_id.lower()


def _rate_gbps(text: str | None) -> float | None:
    # "400 Gb/sec (4X NDR)"
    if not text:
        return None
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


def read_ports(sysfs: str | Path = "/sys") -> list[PortReading]:
    """Every port of every RDMA device under ``<sysfs>/class/infiniband``; [] where there is none."""
    root = Path(sysfs) / "class" / "infiniband"
    try:
        devices = sorted(p for p in root.iterdir())
    except OSError:
        return []
    readings = []
    for device in devices:
        pci_path = _pci_path(device / "device")
        try:
            ports = sorted((p for p in (device / "ports").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        except OSError:
            continue
        for port in ports:
            counters: dict[str, int] = {}
            for name in TRAFFIC_COUNTERS + ERROR_COUNTERS:
                value = _read_int(port / "counters" / name)
                if value is not None:
                    counters[name] = value
            for name in HW_COUNTERS:
                value = _read_int(port / "hw_counters" / name)
                if value is not None:
                    counters[name] = value
            state = _read_text(port / "state") or ""
            readings.append(PortReading(
                device=device.name, port=int(port.name), link_layer=_read_text(port / "link_layer"),
                active="ACTIVE" in state.upper(), rate_gbps=_rate_gbps(_read_text(port / "rate")),
                pci_path=pci_path, counters=counters))
    return readings


def counter_delta(previous: int, current: int) -> int:
    """Increase of a hardware counter between two reads, across a wrap or a reset.

    A value that went backwards either wrapped (the previous value sat in the top half of its
    32- or 64-bit range and the counter rolled over) or was reset (driver reload, perfquery -R),
    in which case the current value is all that happened since.
    """
    if current >= previous:
        return current - previous
    for bits in (32, 64):
        top = 1 << bits
        if previous < top:
            if previous >= top // 2:
                return top - previous + current
            break
    return current


def nearest_port(gpu_pci_path: tuple[str, ...], ports: list[PortReading]) -> PortReading | None:
    """The port closest to the GPU on the PCIe tree: longest shared bridge path, active first."""
    if not gpu_pci_path or not ports:
        return None

    def shared(port: PortReading) -> int:
        n = 0
        for a, b in zip(gpu_pci_path, port.pci_path):
            if a != b:
                break
            n += 1
        return n

    # max() keeps the first of equals, so ties go to the first port in sysfs order.
    return max(ports, key=lambda p: (p.active, shared(p)))


def gpu_pci_path(sysfs: str | Path, bus_id: str) -> tuple[str, ...]:
    return _pci_path(Path(sysfs) / "bus" / "pci" / "devices" / normalise_bus_id(bus_id))


class PortMonitor:
    """Reads the ports at most once per ``min_refresh_s`` and keeps totals and rates per port.

    Shared by all GPUs of a node: the first GPU of a cycle triggers the read, the others reuse it.
    """

    def __init__(self, sysfs: str | Path = "/sys", min_refresh_s: float = 0.5) -> None:
        self._sysfs = Path(sysfs)
        self._min_refresh_s = min_refresh_s
        self._lock = threading.Lock()
        self._last_read = -1e18
        self._raw: dict[tuple[str, int], tuple[float, dict[str, int]]] = {}
        self._totals: dict[tuple[str, int], PortTotals] = {}
        self._readings: list[PortReading] = []
        self._gpu_paths: dict[str, tuple[str, ...]] = {}

    def refresh(self, now: float | None = None) -> list[PortTotals]:
        now = time.monotonic() if now is None else now
        with self._lock:
            if now - self._last_read >= self._min_refresh_s:
                self._last_read = now
                self._readings = read_ports(self._sysfs)
                for reading in self._readings:
                    self._update(reading, now)
                present = {(r.device, r.port) for r in self._readings}
                for gone in set(self._totals) - present:
                    del self._totals[gone]
                    self._raw.pop(gone, None)
            return list(self._totals.values())

    def _update(self, reading: PortReading, now: float) -> None:
        key = (reading.device, reading.port)
        before = self._raw.get(key)
        old = self._totals.get(key)
        deltas: dict[str, int] = {}
        if before is not None:
            for name, value in reading.counters.items():
                if name in before[1]:
                    deltas[name] = counter_delta(before[1][name], value)
        elapsed = now - before[0] if before is not None else None
        tx = deltas.get("port_xmit_data", 0) * WORD_BYTES
        rx = deltas.get("port_rcv_data", 0) * WORD_BYTES
        events = dict(old.events) if old is not None else {}
        for name in ERROR_COUNTERS + HW_COUNTERS:
            if name in reading.counters:
                events[name] = events.get(name, 0.0) + deltas.get(name, 0)
        self._totals[key] = PortTotals(
            device=reading.device, port=reading.port, link_layer=reading.link_layer, active=reading.active,
            rate_gbps=reading.rate_gbps,
            tx_bytes=(old.tx_bytes if old else 0.0) + tx, rx_bytes=(old.rx_bytes if old else 0.0) + rx,
            tx_bytes_per_s=tx / elapsed if elapsed and "port_xmit_data" in deltas else None,
            rx_bytes_per_s=rx / elapsed if elapsed and "port_rcv_data" in deltas else None,
            events=events,
            event_deltas={name: deltas[name] for name in ERROR_COUNTERS + HW_COUNTERS if name in deltas},
            event_rates={name: deltas[name] / elapsed for name in ERROR_COUNTERS + HW_COUNTERS
                         if elapsed and name in deltas})
        self._raw[key] = (now, reading.counters)

    def port_for_gpu(self, bus_id: str | None) -> PortTotals | None:
        """The totals of the port nearest the GPU with this PCI bus id (None if no port or no id)."""
        if not bus_id:
            return None
        with self._lock:
            path = self._gpu_paths.get(bus_id)
            if path is None:
                path = self._gpu_paths[bus_id] = gpu_pci_path(self._sysfs, bus_id)
            port = nearest_port(path, self._readings)
            return self._totals.get((port.device, port.port)) if port else None
