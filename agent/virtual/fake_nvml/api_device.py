"""Per-device C functions: identity, clocks, power, memory, utilisation and processes (MIG: api_mig).

Identity comes from the virtual :class:`~agent.model.DeviceInfo` (so NVML discovery matches the
virtual backend's); every reading comes from the last advance of the device's counters. What
the hardware cannot read returns NOT_SUPPORTED, as on a real GPU: whole-GPU quantities on MIG
devices, utilisation on anything in MIG mode, fields the node's counter preset hides.
"""

from __future__ import annotations

from typing import Any

from agent.model import GpuSample
from agent.virtual.fake_nvml import codes
from agent.virtual.fake_nvml.ctypes_io import Fail, is_null, set_value, target, value, write_string
from agent.virtual.fake_nvml.device import NvmlDevice, memory_busy
from agent.virtual.fake_nvml.symbols import c_function

MIB = 1024**2
DRIVER_RESERVED_BYTES = 512 * MIB
"""Memory the driver reserves for itself: nvmlMemory_v2 ``reserved``, counted in nvmlMemory_t ``used``."""
_VIDEO_CLOCK_RATIO = 0.89
CODEC_SAMPLING_PERIOD_US = 167_000
"""The encoder/decoder utilisation window NVML reports on Hopper (one sixth of a second)."""
_MEMORY_TEMP_OFFSET_C = 3.0


def _need(value: Any) -> Any:
    """A reading the hardware cannot make here (None) is NOT_SUPPORTED."""
    if value is None:
        raise Fail(codes.ERROR_NOT_SUPPORTED)
    return value


class DeviceFunctions:
    """Mixin of :class:`~agent.virtual.fake_nvml.library.FakeNvmlLibrary`: uses its state and helpers."""

    # ------------------------------------------------------------------ helpers

    def _whole(self, dev: NvmlDevice, field: str) -> Any:
        """A whole-GPU reading from the latest sample; NOT_SUPPORTED where it cannot be read."""
        if dev.hidden(field) or dev.counters is None:
            raise Fail(codes.ERROR_NOT_SUPPORTED)
        self._fresh(dev)
        return _need(getattr(self._sample(dev), field))

    def _samples(self, dev: NvmlDevice) -> list[GpuSample]:
        self._fresh(dev)
        samples = dev.latest()
        if not samples:
            raise Fail(codes.ERROR_NOT_SUPPORTED)
        return samples

    def _no_utilisation(self, dev: NvmlDevice) -> None:
        """Utilisation is not reported in MIG mode; a blind node cannot read it at all."""
        if dev.is_mig or dev.mig_enabled:
            raise Fail(codes.ERROR_NOT_SUPPORTED)
        if self.blind or dev.hidden("gr_active"):
            raise Fail(codes.ERROR_NO_PERMISSION)

    # ------------------------------------------------------------------ identity

    @c_function("nvmlDeviceGetName", handle=True)
    def _c_name(self, dev: NvmlDevice, buffer: Any, length: Any) -> None:
        write_string(buffer, length, dev.info.model)

    @c_function("nvmlDeviceGetUUID", handle=True)
    def _c_uuid(self, dev: NvmlDevice, buffer: Any, length: Any) -> None:
        write_string(buffer, length, dev.info.uuid)

    @c_function("nvmlDeviceGetPciInfo_v3", handle=True)
    def _c_pci_info(self, dev: NvmlDevice, out: Any) -> None:
        info = target(out)
        if info is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        bus = int(dev.physical.info.pci_bus_id.split(":")[1], 16) if dev.physical.info.pci_bus_id else 0
        device_id = dev.info.pci_device_id or 0
        info.busIdLegacy = f"{0:04X}:{bus:02X}:00.0".encode()
        info.busId = f"{0:08X}:{bus:02X}:00.0".encode()  # real NVML prints hex digits in upper case
        info.domain = 0
        info.bus = bus
        info.device = 0
        info.pciDeviceId = (device_id << 16) | 0x10DE
        info.pciSubSystemId = (0x16C1 << 16) | 0x10DE

    @c_function("nvmlDeviceGetMinorNumber", handle=True)
    def _c_minor(self, dev: NvmlDevice, out: Any) -> None:
        if dev.is_mig:
            raise Fail(codes.ERROR_NOT_SUPPORTED)
        set_value(out, dev.index)

    @c_function("nvmlDeviceGetIndex", handle=True)
    def _c_index(self, dev: NvmlDevice, out: Any) -> None:
        if dev.is_mig:
            raise Fail(codes.ERROR_NOT_SUPPORTED)
        set_value(out, dev.index)

    @c_function("nvmlDeviceGetArchitecture", handle=True)
    def _c_architecture(self, dev: NvmlDevice, out: Any) -> None:
        set_value(out, self.traits.architecture)

    @c_function("nvmlDeviceGetCudaComputeCapability", handle=True)
    def _c_compute_capability(self, dev: NvmlDevice, major: Any, minor: Any) -> None:
        set_value(major, self.traits.compute_capability[0])
        set_value(minor, self.traits.compute_capability[1])

    @c_function("nvmlDeviceGetAttributes", "nvmlDeviceGetAttributes_v2", handle=True)
    def _c_attributes(self, dev: NvmlDevice, out: Any) -> None:
        attrs = target(out)
        if attrs is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        g = dev.slices
        hbm = self.traits.hbm
        attrs.multiprocessorCount = dev.info.sm_count or 0
        attrs.sharedCopyEngineCount = max(1, round(8 * g / 7)) if self.mig_slices == 7 else g  # A30: 1 per slice
        attrs.sharedDecoderCount = g if hbm else 3
        attrs.sharedEncoderCount = 0 if hbm else 3
        attrs.sharedJpegCount = g if hbm else 4
        attrs.sharedOfaCount = 1 if g == self.mig_slices else 0
        attrs.gpuInstanceSliceCount = g if (dev.is_mig or self.mig_capable) else 0
        attrs.computeInstanceSliceCount = (dev.ci_slices or g) if (dev.is_mig or self.mig_capable) else 0
        attrs.memorySizeMB = (dev.info.memory_total_bytes or 0) // MIB

    @c_function("nvmlDeviceGetPersistenceMode", handle=True)
    def _c_persistence(self, dev: NvmlDevice, out: Any) -> None:
        set_value(out, 1 if self.profile.persistence_mode else 0)

    # ------------------------------------------------------------------ clocks

    @c_function("nvmlDeviceGetMaxClockInfo", handle=True)
    def _c_max_clock(self, dev: NvmlDevice, clock_type: Any, out: Any) -> None:
        kind = value(clock_type)
        sm_max = dev.info.sm_clock_max_mhz
        if kind in (codes.CLOCK_GRAPHICS, codes.CLOCK_SM):
            set_value(out, round(_need(sm_max)))
        elif kind == codes.CLOCK_MEM:
            set_value(out, self.traits.memory_clock_mhz)
        elif kind == codes.CLOCK_VIDEO:
            set_value(out, round(_VIDEO_CLOCK_RATIO * _need(sm_max)))
        else:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)

    @c_function("nvmlDeviceGetClockInfo", handle=True)
    def _c_clock(self, dev: NvmlDevice, clock_type: Any, out: Any) -> None:
        kind = value(clock_type)
        if kind not in (codes.CLOCK_GRAPHICS, codes.CLOCK_SM, codes.CLOCK_MEM, codes.CLOCK_VIDEO):
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        clocks = [s.sm_clock_mhz for s in self._samples(dev) if s.sm_clock_mhz is not None]
        sm = _need(max(clocks) if clocks else None)
        if kind == codes.CLOCK_MEM:
            set_value(out, self.traits.memory_clock_mhz)
        elif kind == codes.CLOCK_VIDEO:
            set_value(out, round(_VIDEO_CLOCK_RATIO * sm))
        else:
            set_value(out, round(sm))

    @c_function("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons", handle=True)
    def _c_clock_reasons(self, dev: NvmlDevice, out: Any) -> None:
        reasons = [s.clock_event_reasons for s in self._samples(dev) if s.clock_event_reasons is not None]
        if not reasons:
            raise Fail(codes.ERROR_NOT_SUPPORTED)
        bits = 0
        for r in reasons:
            bits |= r
        set_value(out, bits)

    # ------------------------------------------------------------------ power, energy, temperature

    @c_function("nvmlDeviceGetPowerUsage", handle=True)
    def _c_power(self, dev: NvmlDevice, out: Any) -> None:
        set_value(out, round(self._whole(dev, "power_w") * 1000.0))

    @c_function("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit", handle=True)
    def _c_power_limit(self, dev: NvmlDevice, out: Any) -> None:
        set_value(out, round(self._whole(dev, "power_limit_w") * 1000.0))

    @c_function("nvmlDeviceGetTotalEnergyConsumption", handle=True)
    def _c_energy(self, dev: NvmlDevice, out: Any) -> None:
        joules = self._board_energy_j(dev) if dev.mig_enabled else self._whole(dev, "energy_j")
        set_value(out, round(joules * 1000.0))

    def _board_energy_j(self, dev: NvmlDevice) -> float:
        """A GPU in MIG mode: the board's counter (agent.virtual.engine.VirtualEngine.board_energy_j: what the
        engine's instances drew, which NVML shows for no MIG device, plus the idle draw of the slices in no
        instance) up to its instances' last advance; NOT_SUPPORTED where the node's counter preset hides energy."""
        if "energy_j" in self.board_hidden:
            raise Fail(codes.ERROR_NOT_SUPPORTED)
        self._fresh(dev)
        advanced = [c.counters.last_t for c in dev.children if c.counters is not None and c.counters.last_t is not None]
        vt = (max(advanced) if advanced else self._now()) - self.backend.start_time
        return self.backend.engine.board_energy_j(self.backend.node, dev.index, vt)

    @c_function("nvmlDeviceGetTemperature", handle=True)
    def _c_temperature(self, dev: NvmlDevice, sensor: Any, out: Any) -> None:
        if value(sensor) != codes.TEMPERATURE_GPU:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        set_value(out, round(self._whole(dev, "temperature_c")))

    @c_function("nvmlDeviceGetTemperatureV", handle=True)
    def _c_temperature_v(self, dev: NvmlDevice, out: Any) -> None:
        temp = target(out)
        if temp is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        if temp.version != codes.TEMPERATURE_V1:
            raise Fail(codes.ERROR_ARGUMENT_VERSION_MISMATCH)
        if temp.sensorType != codes.TEMPERATURE_GPU:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        temp.temperature = round(self._whole(dev, "temperature_c"))

    # ------------------------------------------------------------------ memory

    def _memory(self, dev: NvmlDevice) -> tuple[int, int, int]:
        """(total, reserved, used) bytes as nvmlMemory_v2_t has them; free = total - reserved - used.

        The virtual ``mem_used_bytes`` is what processes hold (their contexts included), i.e.
        v2 ``used``; the driver's own reservation is only in v1 ``used`` (as on real GPUs,
        where an idle GPU shows a few hundred MiB used in nvmlMemory_t and ~0 in v2).
        """
        if dev.mig_enabled and not self.profile.privileged:
            raise Fail(codes.ERROR_NO_PERMISSION)  # aggregate MIG memory needs privileges (nvml.h)
        samples = self._samples(dev)
        total = dev.info.memory_total_bytes or sum(s.mem_total_bytes or 0 for s in samples)
        used = min(total, sum(s.mem_used_bytes or 0 for s in samples))
        return total, min(DRIVER_RESERVED_BYTES, total - used), used

    @c_function("nvmlDeviceGetMemoryInfo", handle=True)
    def _c_memory(self, dev: NvmlDevice, out: Any) -> None:
        mem = target(out)
        if mem is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        total, reserved, used = self._memory(dev)
        mem.total, mem.used, mem.free = total, used + reserved, total - used - reserved

    @c_function("nvmlDeviceGetMemoryInfo_v2", handle=True)
    def _c_memory_v2(self, dev: NvmlDevice, out: Any) -> None:
        mem = target(out)
        if mem is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        if mem.version != codes.MEMORY_V2:
            raise Fail(codes.ERROR_ARGUMENT_VERSION_MISMATCH)
        total, reserved, used = self._memory(dev)
        mem.total, mem.reserved, mem.used, mem.free = total, reserved, used, total - used - reserved

    # ------------------------------------------------------------------ utilisation

    @c_function("nvmlDeviceGetUtilizationRates", handle=True)
    def _c_utilization(self, dev: NvmlDevice, out: Any) -> None:
        util = target(out)
        if util is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        self._no_utilisation(dev)
        self._fresh(dev)
        s = self._sample(dev)
        util.gpu = round(100.0 * _need(s.gr_active))
        util.memory = round(100.0 * memory_busy(s))

    @c_function("nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetDecoderUtilization", handle=True)
    def _c_codec_utilization(self, dev: NvmlDevice, utilization: Any, sampling_period_us: Any) -> None:
        """The video engines: idle in every simulated workload (none encodes or decodes video)."""
        if target(utilization) is None or target(sampling_period_us) is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        self._no_utilisation(dev)
        set_value(utilization, 0)
        set_value(sampling_period_us, CODEC_SAMPLING_PERIOD_US)

    @c_function("nvmlDeviceGetFanSpeed", "nvmlDeviceGetFanSpeed_v2", handle=True)
    def _c_fan_speed(self, dev: NvmlDevice, *args: Any) -> None:
        """Data-centre GPUs (SXM, OAM, passively cooled PCIe) have no fan of their own."""
        raise Fail(codes.ERROR_NOT_SUPPORTED)

    @c_function("nvmlDeviceGetPcieThroughput", handle=True)
    def _c_pcie_throughput(self, dev: NvmlDevice, counter: Any, out: Any) -> None:
        """KB/s over the last sampling window, as the driver reports it (counter 0 TX, 1 RX).

        The real call samples for about 20 ms before it returns; the fake answers at once."""
        if target(out) is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        which = value(counter)
        if which not in (codes.PCIE_UTIL_TX_BYTES, codes.PCIE_UTIL_RX_BYTES):
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        key = "pcie_tx_bytes_per_s" if which == codes.PCIE_UTIL_TX_BYTES else "pcie_rx_bytes_per_s"
        set_value(out, round(self._whole(dev, key) / 1024))

    def _process_utils(self, dev: NvmlDevice, last_seen_us: int) -> list[Any]:
        self._no_utilisation(dev)
        self._fresh(dev)
        assert dev.counters is not None
        samples = dev.counters.process_samples_after(last_seen_us)
        if not samples:
            raise Fail(codes.ERROR_NOT_FOUND)
        return samples

    @c_function("nvmlDeviceGetProcessUtilization", handle=True)
    def _c_process_utilization(self, dev: NvmlDevice, utilization: Any, count: Any, last_seen: Any) -> int | None:
        if target(count) is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        samples = self._process_utils(dev, value(last_seen))
        array = target(utilization)
        room = value(count)
        set_value(count, len(samples))
        if array is None or room < len(samples):
            return codes.ERROR_INSUFFICIENT_SIZE
        for i, p in enumerate(samples):
            entry = array[i]
            entry.pid, entry.timeStamp, entry.smUtil, entry.memUtil = p.pid, p.ts_us, p.sm, p.mem
            entry.encUtil = entry.decUtil = 0
        return None

    @c_function("nvmlDeviceGetProcessesUtilizationInfo", handle=True)
    def _c_processes_utilization_info(self, dev: NvmlDevice, out: Any) -> int | None:
        info = target(out)
        if info is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        if info.version != codes.PROCESSES_UTILIZATION_INFO_V1:
            raise Fail(codes.ERROR_ARGUMENT_VERSION_MISMATCH)
        samples = self._process_utils(dev, int(info.lastSeenTimeStamp))
        room = int(info.processSamplesCount)
        info.processSamplesCount = len(samples)
        if not info.procUtilArray or room < len(samples):
            return codes.ERROR_INSUFFICIENT_SIZE
        array = info.procUtilArray
        for i, p in enumerate(samples):
            entry = array[i]
            entry.timeStamp, entry.pid, entry.smUtil, entry.memUtil = p.ts_us, p.pid, p.sm, p.mem
            entry.encUtil = entry.decUtil = entry.jpgUtil = entry.ofaUtil = 0
        return None

    # ------------------------------------------------------------------ processes

    @c_function("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2", handle=True)
    def _c_compute_processes(self, dev: NvmlDevice, count: Any, infos: Any) -> int | None:
        return self._fill_processes(dev, count, infos, mps=False)

    @c_function("nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v2", handle=True)
    def _c_mps_processes(self, dev: NvmlDevice, count: Any, infos: Any) -> int | None:
        """The MPS clients (nvml.h: Volta and newer; ``_v2`` from R470, ``_v3`` from R510, gated in profile.py):
        the scenario's MPS holders, each also in the compute list as nvidia-smi's ``M+C`` type says. The MPS
        server process is not simulated; a GPU without MPS clients lists none (success, count 0)."""
        return self._fill_processes(dev, count, infos, mps=True)

    def _fill_processes(self, dev: NvmlDevice, count: Any, infos: Any, *, mps: bool) -> int | None:
        if target(count) is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        self._fresh(dev)
        rows: list[tuple[int, int, int, int]] = []
        for d in ([dev] if dev.counters is not None else dev.children):
            s = d.counters.latest if d.counters is not None else None
            if d.is_mig and d.parent is not None and d is not d.parent.first_of_gi(d.gi):
                continue  # the engine runs a GPU instance's processes: listed on its first compute instance
            clients = _mps_clients(s) if mps else None
            for p in (s.processes or ()) if s is not None else ():
                if clients is not None and p.pid not in clients:
                    continue
                used = p.used_memory_bytes if p.used_memory_bytes is not None else codes.ULL_NOT_AVAILABLE
                gi, ci = (d.gi, d.ci) if d.is_mig else (codes.UINT_MAX, codes.UINT_MAX)
                rows.append((p.pid, used, gi, ci))
        room = value(count)
        set_value(count, len(rows))
        if not rows:
            return None
        array = target(infos)
        if is_null(infos) or array is None or room < len(rows):
            return codes.ERROR_INSUFFICIENT_SIZE
        for i, (pid, used, gi, ci) in enumerate(rows):
            entry = array[i]
            entry.pid, entry.usedGpuMemory, entry.gpuInstanceId, entry.computeInstanceId = pid, used, gi, ci
        return None

    @c_function("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2", handle=True)
    def _c_no_processes(self, dev: NvmlDevice, count: Any, infos: Any) -> None:
        """Graphics processes: none in any simulated workload (CUDA compute only)."""
        if target(count) is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        set_value(count, 0)


def _mps_clients(sample: GpuSample | None) -> frozenset[int]:
    """PIDs of the scenario's MPS clients on a device: its holders ``via="mps"`` (agent.virtual.plans)."""
    who = sample.attribution if sample is not None else None
    return frozenset(pid for h in (who.holders or ()) if h.kind == "process" and h.via == "mps"
                     for pid in h.pids) if who is not None else frozenset()
