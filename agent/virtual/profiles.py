"""How a scenario node's (fake) drivers behave: the ``nvml``, ``dcgm`` and ``amd`` blocks of a node.

These are kept apart from the node schema because their readers are different: the fake
libnvidia-ml (:mod:`agent.virtual.fake_nvml`) and the fake libamd_smi
(:mod:`agent.virtual.fake_amdsmi`) import only these, while the engine reads just the AMD
partition modes through :class:`~agent.virtual.nodes.Node`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from agent.virtual.devices import COMPUTE_PARTITIONS, MEMORY_PARTITIONS, ComputePartition, MemoryPartition
from agent.virtual.workloads import StrictModel

DriverVersion = Annotated[str, Field(pattern=r"^\d{3,4}\.\d{1,3}(\.\d{1,3})?$")]
CSymbol = Annotated[str, Field(pattern=r"^nvml[A-Za-z0-9_]+$")]
MigInstanceId = Annotated[str, Field(pattern=r"^\d+/\d+$")]


class NvmlProfile(StrictModel):
    """How the node's (fake) NVIDIA driver behaves, for :mod:`agent.virtual.fake_nvml`.

    Only the fake libnvidia-ml reads this; the virtual backend ignores it. It lets tests and the
    demo run the real NVML backend against old drivers, locked-down containers and flaky fields.
    """

    driver_version: DriverVersion = Field(
        "580.95.05", description="nvmlSystemGetDriverVersion; it gates which symbols and field ids exist, as each "
        "release's nvml.h declares them (< 510: no nvmlDeviceGetComputeRunningProcesses_v3 nor "
        "nvmlDeviceGetMemoryInfo_v2; < 520: no nvmlGpm*; < 525: no nvmlGpmMigSampleGet; < 535: no "
        "nvmlDeviceGetCurrentClocksEventReasons; < 550: no nvmlDeviceGetProcessesUtilizationInfo; < 565: no "
        "nvmlDeviceGetTemperatureV; < 555: PCIe byte fields 197/198 unknown; clocks-event time fields at 251-253 "
        "from 575 to 580.76, at 269-271 from 580.82, absent before 575; a field id the driver does not know "
        "fails with INVALID_ARGUMENT).")
    cuda_driver_version: int = Field(
        13000, ge=1000, description="nvmlSystemGetCudaDriverVersion (1000 x major + 10 x minor); its major "
        "is the first part of nvmlSystemGetNVMLVersion ('13.580.95.05').")
    driver_loaded: bool = Field(True, description="False: nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED.")
    persistence_mode: bool = Field(True, description="nvmlDeviceGetPersistenceMode.")
    gpm: bool = Field(True, description="False: nvmlGpmQueryDeviceSupport says unsupported even on Hopper or newer.")
    gpm_cumulative: Literal["since_reboot", "differences", "call_fails"] = Field(
        "since_reboot", description="How a driver that has the cumulative GPM metrics (ids 248-260; R590 and later "
        "here, an assumption) answers them in nvmlGpmMetricsGet: since_reboot: a running total at the second sample "
        "(cycles, bytes for PCIe), as nvml.h's comments say and DCGM 4.6 reads them; differences: the change between "
        "the two samples (a driver that reads them per interval: the agent's self-check must catch it); call_fails: "
        "a call asking for any of them fails whole with INVALID_ARGUMENT.")
    no_permission: list[CSymbol] = Field(
        default_factory=list, description="C symbols (e.g. nvmlGpmSampleGet) that return NVML_ERROR_NO_PERMISSION.")
    not_supported: list[CSymbol] = Field(
        default_factory=list, description="C symbols that return NVML_ERROR_NOT_SUPPORTED.")
    failing_fields: list[int] = Field(
        default_factory=list, description="nvmlDeviceGetFieldValues field ids that fail with NOT_SUPPORTED "
        "inside an otherwise successful batch.")
    privileged: bool = Field(
        True, description="False: the agent runs unprivileged (the container image's uid 65534), and the "
        "aggregate memory of a GPU in MIG mode (nvmlDeviceGetMemoryInfo/_v2 on the parent handle) answers "
        "NO_PERMISSION, as nvml.h documents; MIG device handles still answer.")
    pcie_counter_start: int = Field(
        0, ge=0, lt=2**32, description="Where the PCIe byte counters (fields 197/198, 32 bits, wrapping) start; "
        "close to 2**32 they wrap within the first intervals.")
    mig_compute_instances: dict[MigInstanceId, list[Annotated[int, Field(ge=1, le=7)]]] = Field(
        default_factory=dict, description="Split a MIG GPU instance (its id, e.g. '0/1') into compute instances "
        "of these slice counts, e.g. {'0/1': [1, 2]} for a 3g instance: each is its own MIG device "
        "('... MIG 1c.3g.40gb'), with the instance's memory and its share of the SMs.")

    @property
    def driver_major(self) -> int:
        return int(self.driver_version.split(".", 1)[0])


class DcgmProfile(StrictModel):
    """How the node's (fake) DCGM host engine behaves, for :mod:`agent.virtual.fake_dcgm` (``dcgm: on``)."""

    version: str = Field("4.6.0", pattern=r"^\d+\.\d+\.\d+$", description="The DCGM release (dcgmVersionInfo): "
                         "3.x loads libdcgm.so.3; 4.5+ has dcgmConnect_v3; 4.6+ knows the cumulative counters.")
    cumulative: bool = Field(False, description="True: the host engine offers DCGM 4.6's cumulative counters "
                             "(DCGM_FI_PROF_*_CYCLES_*_TOTAL, ids 1084-1096; not before 4.6.0), which the agent "
                             "prefers to the sampled ratios (Δactive / Δelapsed over its own window).")
    ratios: bool = Field(True, description="False: the host engine offers none of the sampled SM, occupancy, tensor "
                         "and FP-pipe ratios (1002-1004, 1006-1008): with cumulative, a node whose pipe activity only the "
                         "cumulative counters give (engine and DRAM activity, which no counter gives, stay).")


AmdSymbol = Annotated[str, Field(pattern=r"^amdsmi_[a-z0-9_]+$")]


class AmdProfile(StrictModel):
    """How the node's AMD GPUs are partitioned and how its (fake) libamd_smi behaves.

    The partition modes shape the devices every backend sees; the rest only matters to the fake
    library of :mod:`agent.virtual.fake_amdsmi` that the real amdsmi package runs on.
    """

    compute_partition: ComputePartition = Field(
        "SPX", description="SPX: one device per GPU; DPX/QPX/CPX: 2/4/8 devices per GPU, one per group of XCDs "
        "(MI300X, MI325X, MI355X).")
    memory_partition: MemoryPartition = Field(
        "NPS1", description="NUMA nodes per socket; never more than the compute partitions (NPS4 needs CPX).")
    rocm_version: str = Field("7.0.2", pattern=r"^\d+\.\d+(\.\d+)?$", description="amdsmi_get_lib_version.")
    driver_version: str = Field("6.12.12", min_length=1, description="amdgpu driver version (amdsmi_get_gpu_driver_info).")
    library: bool = Field(True, description="False: libamd_smi.so is missing (importing amdsmi raises KeyError).")
    missing_symbols: list[AmdSymbol] = Field(
        default_factory=list, description="C symbols the library lacks: importing a newer amdsmi wrapper fails "
        "with 'undefined symbol', as on a ROCm older than the wrapper.")
    not_supported: list[AmdSymbol] = Field(
        default_factory=list, description="C symbols that return AMDSMI_STATUS_NOT_SUPPORTED.")
    no_permission: list[AmdSymbol] = Field(
        default_factory=list, description="C symbols that return AMDSMI_STATUS_NO_PERM.")
    na_metrics: list[str] = Field(
        default_factory=list, description="amdsmi_gpu_metrics_t fields the firmware leaves at all ones "
        "(the amdsmi package reports them as 'N/A').")
    device_metrics_exporter: bool = Field(
        False, description="True: the node also runs a virtual AMD Device Metrics Exporter (agent.virtual.fake_dme) "
        "serving DME's /metrics with the profiler's series; amd-virtual joins it, so verdicts rest on counters.")

    @model_validator(mode="after")
    def _nps_within_partitions(self) -> "AmdProfile":
        if MEMORY_PARTITIONS[self.memory_partition] > COMPUTE_PARTITIONS[self.compute_partition]:
            raise ValueError(f"memory_partition: {self.memory_partition} needs at least as many compute partitions "
                             f"({self.compute_partition} has {COMPUTE_PARTITIONS[self.compute_partition]})")
        return self
