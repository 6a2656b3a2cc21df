"""A virtual AMD Device Metrics Exporter (DME) beside the fake libamd_smi, so the demo's AMD node can show the
profiler's counters (docs/amd.md, "AMD Device Metrics Exporter as a source").

A real DME reads the GPUs through gpuagent (amdsmi) and, when ``ProfilerMetrics`` is on, through rocpctl
(rocprofiler); it serves them on ``/metrics`` in its own names and labels. This one serves the same names and label
set (the 1.5.x layout of tests/fixtures/amd-exporter, whose README cites each), rendered from the virtual samples
the fake libamd_smi last played for each processor (:attr:`AmdDevice.latest`: it consumes no sample span of its
own), so the amdsmi backend and this exporter describe the same GPUs at the same moment, as on a node:

* labels: ``gpu_id`` = the device's position in amdsmi's processor list, ``serial_number`` = the fake's board
  serial (:func:`board_serial`, shared by a GPU's partitions), ``gpu_partition_id`` = KFD's partition id,
  ``card_model`` = the board part number the catalogue's model is known by
  (:mod:`agent.backends.amd_exporter.boards`);
* profiler values per window of :data:`WINDOW_US`: GPU_UTIL = the sample's ``gr_active``; MfmaUtil, VALUBusy and
  occupancy = ``tensor_active``/``sm_active``/``sm_occupancy`` over ``gr_active`` (DME's are shares of GPU-active
  cycles); TOTAL_16_OPS = ``tensor_active`` x the device's BF16 peak x the window; FETCH/WRITE_SIZE = ``dram_active``
  x the device's bandwidth x the window, in KiB (a fifth written);
* the whole GPU's activity, power and clock on partition 0 only, as DME prints them (metricslist.md:77-95);
* ``gpu_process_cu_occupancy{process_id="<pid>", <GPU labels>}`` (1.5.0+) per process of each processor whose
  compute units the engine says, as gpuagent copies amdsmi's ``cu_occupancy``;
* ``/gpumetrics`` (DME 1.4.0+): gpuagent's ``GPUGetResponse`` as Go's ``encoding/json`` writes it (field names of the
  ``json`` tags, zero values left out, enums as numbers; :mod:`agent.backends.amd_exporter.gpumetrics` cites the
  sources), one entry per processor with ``Status.Index`` = its ``gpu_id`` and ``Status.PCIeStatus.PCIeBusId`` = the
  fake library's BDF in gpuagent's upper case (each partition its own function).

:attr:`VirtualDme.order` (tests) makes this exporter enumerate otherwise than amdsmi: ``gpu_id`` = the position of
the device's amdsmi ordinal in that list, on both endpoints, as a gpuagent that enumerated differently would.

It is a simulation of the format, not of DME's sampling: every value is the latest sample's, not one 1 ms window
every 10 s. Optional (``amd: {device_metrics_exporter: true}`` in a scenario), so the default demo stays amdsmi alone.
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Sequence

from agent.virtual.fake_amdsmi.api_identity import board_serial

WINDOW_US = 1000.0
"""The profiler window the values are rendered for: DME's default from 1.4.1 (the agent's default too)."""
PARTS = {"mi300x": "102-G30211-0C", "mi355x": "102-G36218-0C", "mi350x": "102-G36212-0C", "mi250x": "102-D65201"}
"""Catalogue key -> the board part number DME would print as ``card_model`` (sources: amd_exporter/boards.py)."""
MIB = 1024 * 1024


def _g(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:.6g}"


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


def gpu_id(library: Any, dev: Any, order: Sequence[int] | None = None) -> int:
    """DME's ``gpu_id`` (gpuagent's ``Status.Index``) of a fake amdsmi processor: its ordinal in amdsmi's processor
    list, or with ``order`` (amdsmi ordinals in this exporter's enumeration order) its position there."""
    ordinal = library._ordinal(dev)
    return order.index(ordinal) if order is not None else ordinal


def device_labels(library: Any, dev: Any, order: Sequence[int] | None = None) -> dict[str, str]:
    """DME 1.5's mandatory GPU labels for one fake amdsmi processor."""
    profile = library.profile
    model = library.node.model
    partitioned = len(library._socket_of(dev).devices) > 1
    return {"card_model": PARTS.get(model, ""), "container": "", "deployment_mode": "baremetal",
            "gpu_compute_partition_type": profile.compute_partition.lower() if model != "mi250x" else "none",
            "gpu_id": str(gpu_id(library, dev, order)),
            "gpu_memory_partition_type": profile.memory_partition.lower() if model != "mi250x" else "none",
            "gpu_partition_id": str(dev.partition if partitioned else 0), "hostname": library.backend.node,
            "job_id": "", "job_partition": "", "job_user": "", "namespace": "", "pod": "",
            "serial_number": board_serial(library.backend.node, dev.index)}


def _profiler(sample: Any, spec: Any) -> dict[str, float]:
    gr = sample.gr_active or 0.0
    out = {"gpu_prof_gui_util_percent": 100.0 * gr}

    def of_active(value: float | None) -> float:
        return min(100.0, 100.0 * value / gr) if value and gr > 0 else 0.0

    out["gpu_prof_tensor_active_percent"] = of_active(sample.tensor_active)
    out["gpu_prof_sm_active"] = of_active(sample.sm_active)
    out["gpu_prof_occupancy_percent"] = of_active(sample.sm_occupancy)
    window_s = WINDOW_US * 1e-6
    peak16 = spec.peak_flops.get("bf16") if spec is not None else None
    if peak16:
        out["gpu_prof_total_16_ops"] = (sample.tensor_active or 0.0) * peak16 * window_s
    bandwidth = spec.mem_bandwidth_bytes_per_s if spec is not None else None
    if bandwidth and sample.dram_active is not None:
        kib = sample.dram_active * bandwidth * window_s / 1024
        out["gpu_prof_fetch_size"], out["gpu_prof_write_size"] = kib * 0.8, kib * 0.2
    return out


def render(library: Any, order: Sequence[int] | None = None) -> str:
    """The ``/metrics`` body DME would serve for the fake library's node, from each processor's latest sample."""
    families: dict[str, list[str]] = {}

    def add(name: str, labels: dict[str, str], value: float) -> None:
        families.setdefault(name, []).append(f"{name}{{{_labels(labels)}}} {_g(value)}")

    for dev in library.devices:
        labels = device_labels(library, dev, order)
        info = dev.info
        if info.memory_total_bytes:
            add("gpu_total_vram", labels, info.memory_total_bytes // MIB)
        sample = dev.latest
        if sample is None:
            continue
        primary = labels["gpu_partition_id"] == "0"
        socket = library._socket_of(dev).devices
        if sample.mem_used_bytes is not None:
            add("gpu_used_vram", labels, sample.mem_used_bytes // MIB)
        if sample.gr_active is not None:
            add("gpu_gfx_busy_instantaneous", {**labels, "xcc_index": "0"}, round(100 * sample.gr_active))
        if primary:
            latest = [d.latest for d in socket if d.latest is not None]
            gr = [s.gr_active for s in latest if s.gr_active is not None]
            if gr:
                add("gpu_gfx_activity", labels, round(100 * sum(gr) / len(gr)))
            watts = [s.power_w for s in latest if s.power_w is not None]
            if watts:
                power = "gpu_average_package_power" if library.node.model == "mi250x" else "gpu_package_power"
                add(power, labels, round(sum(watts)))
            if sample.sm_clock_mhz is not None:
                add("gpu_clock", {**labels, "clock_index": "0", "clock_type": "system"}, round(sample.sm_clock_mhz))
        for name, value in _profiler(sample, info.spec).items():
            add(name, labels, value)
        for proc in sample.processes or ():
            # DME 1.5.0+: one series per process gpuagent lists on this GPU object, labelled process_id; a PID 0 or
            # an occupancy amdsmi could not read (all ones) is left out (v1.5.1 gpuagent_gpu_metrics.go:2760-2772)
            if proc.pid and proc.compute_units is not None:
                add("gpu_process_cu_occupancy", {"process_id": str(proc.pid), **labels}, proc.compute_units)
    lines = ["# HELP gpu_nodes_total Number of GPUs in the node", "# TYPE gpu_nodes_total gauge",
             f'gpu_nodes_total{{hostname="{library.backend.node}"}} {len(library.devices)}']
    for name in sorted(families):
        lines += [f"# TYPE {name} gauge", *families[name]]
    return "\n".join(lines) + "\n"


COMPUTE_PARTITION_TYPES = {"spx": 1, "dpx": 2, "tpx": 3, "qpx": 4, "cpx": 5}
"""amdgpu.GPUComputePartitionType (v1.5.1:pkg/amdgpu/gen/amdgpu/gpu.pb.go:251-261); NONE (0) is left out."""


def _omit_zero(fields: dict[str, Any]) -> dict[str, Any]:
    """Go's ``omitempty``: zero numbers, empty strings and lists, absent messages are not written."""
    return {k: v for k, v in fields.items() if v not in (0, "", None, [], {})}


def _uuid_bytes(text: str | None) -> str:
    """``Spec.Id``: gpuagent's 16-byte key, base64 as ``encoding/json`` writes a ``[]byte``."""
    try:
        return base64.b64encode(uuid.UUID(text or "").bytes).decode()
    except ValueError:
        return ""


def render_gpumetrics(library: Any, order: Sequence[int] | None = None) -> str:
    """The ``/gpumetrics`` body DME would serve: one ``GPU`` (Spec, Status) per fake amdsmi processor, in
    ``gpu_id`` order. Only the identity fields are filled; a real answer also carries ``Stats`` and much more."""
    entries = []
    for dev in sorted(library.devices, key=lambda d: gpu_id(library, d, order)):
        labels = device_labels(library, dev, order)
        partitioned = len(library._socket_of(dev).devices) > 1
        bdf = (dev.info.pci_bus_id or "").upper()
        spec = _omit_zero({"Id": _uuid_bytes(dev.info.uuid),
                           "ComputePartitionType": COMPUTE_PARTITION_TYPES.get(labels["gpu_compute_partition_type"], 0)})
        status = _omit_zero({
            "Index": gpu_id(library, dev, order), "SerialNum": labels["serial_number"],
            "CardSeries": dev.info.model, "CardModel": labels["card_model"], "CardVendor": "Advanced Micro Devices, Inc.",
            "OperStatus": 1, "PCIeStatus": _omit_zero({"SlotType": 2, "Version": 5, "PCIeBusId": bdf, "Width": 16,
                                                       "MaxWidth": 16, "Speed": 32, "MaxSpeed": 32}),
            "PartitionId": dev.partition if partitioned else 0})
        entries.append({"Spec": spec, "Status": status})
    return json.dumps(_omit_zero({"Response": entries})) + "\n"


IN_PROCESS_URL = "http://virtual-amd-exporter.invalid/metrics"
"""What the demo's reader is pointed at: no port is opened (``.invalid`` never resolves), the body is rendered
in process by :meth:`VirtualDme.fetch`; a user who chose ``--listen`` finds no other port open."""


class VirtualDme:
    """DME's ``/metrics`` and ``/gpumetrics`` for one fake libamd_smi, until :meth:`close`: rendered in process for
    the reader that asks through :meth:`fetch` (the demo), and with ``serve`` on 127.0.0.1 and a free port too,
    for a test or a tool that reads it over HTTP."""

    def __init__(self, library: Any, host: str = "127.0.0.1", port: int = 0, *, serve: bool = True) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server name
                answer = owner.body(self.path)
                if answer is None:
                    self.send_error(404)
                    return
                body, kind = answer
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # the agent's log is not the place for each scrape
                return

        self.library = library
        self.order: list[int] | None = None
        """amdsmi ordinals in this exporter's ``gpu_id`` order (None: amdsmi's own order)."""
        self.gpumetrics = True
        """False: ``/gpumetrics`` answers 404, as before DME 1.4.0."""
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = IN_PROCESS_URL
        if serve:
            self._server = ThreadingHTTPServer((host, port), Handler)
            self._server.daemon_threads = True
            self.url = f"http://{host}:{self._server.server_address[1]}/metrics"
            self._thread = threading.Thread(target=self._server.serve_forever, name="virtual-dme", daemon=True)
            self._thread.start()

    def body(self, url_or_path: str) -> tuple[bytes, str] | None:
        """(body, content type) of a path (or a URL's path), or None for a path DME does not serve."""
        path = "/" + url_or_path.split("://", 1)[-1].split("/", 1)[-1] if "://" in url_or_path else url_or_path
        path = path.split("?")[0]
        if path == "/metrics":
            return render(self.library, self.order).encode(), "text/plain; version=0.0.4; charset=utf-8"
        if path == "/gpumetrics" and self.gpumetrics:
            return render_gpumetrics(self.library, self.order).encode(), "application/json"
        return None

    def fetch(self, url: str, timeout_s: float, max_bytes: int) -> bytes:
        """The exporter reader's fetch (agent.backends.exporter_reader.Fetch), answered in process; a 404 and a
        body over ``max_bytes`` fail as the HTTP fetch does."""
        from agent.context.workload.inference.fetch import HttpStatus, ResponseTooLarge

        answer = self.body(url)
        if answer is None:
            raise HttpStatus(404, "Not Found")
        if len(answer[0]) > max_bytes:
            raise ResponseTooLarge(f"answer larger than {max_bytes} bytes")
        return answer[0]

    @property
    def serving(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
