"""Agent settings from a YAML file, ``ROOFWATCH_*`` environment variables and command-line flags.

Precedence, highest first: flags > environment > config file > built-in defaults. A node
fleet is usually configured by one file baked into the image or ConfigMap, with a per-node
override by environment, and a person debugging on one node reaches for a flag.

An invalid value never falls back silently: :func:`load_settings` raises :class:`ConfigError`
whose message names the field, what was given and what is allowed, and the CLI exits with 2.
"""

from __future__ import annotations

import contextvars
import ipaddress
import os
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from agent.app.config_input import ConfigInputError, describe_environment_error, read_config_file, shown
from agent.app.secrets import remember_secrets
from agent.context.file_input import FileInputError, read_text_file
from agent.context.yaml_input import printable_name
from agent.classifier.thresholds import Thresholds
from agent.context.workload.inference.endpoint import InferenceEndpoint, ModelFacts
from agent.model import Dtype
from agent.model.terms import DEFAULT_PORT
from agent.model.redact import safe_url  # a URL setting in an error: no user:password@, no query values

MAX_TOKEN_FILE_BYTES = 64 * 2**10
"""A bearer token is tens of bytes; a file past 64 KiB is not a token file."""
_config_data: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("roofwatch_config_data",
                                                                                     default=None)
"""The settings file as :func:`load_settings` read it, for the source that sits under the environment."""


class ConfigError(ValueError):
    """A configuration problem meant for a person: names the field and what is allowed."""


def parse_listen(value: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` / ``:PORT`` / ``[v6]:PORT`` into (host, port); empty host = all interfaces."""
    text = value.strip()
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
        if not sep:
            raise ValueError(f"{shown(value)} is not HOST:PORT (IPv6 hosts look like [::1]:{DEFAULT_PORT})")
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"{shown(value)} is not HOST:PORT (for example 0.0.0.0:{DEFAULT_PORT} or :{DEFAULT_PORT})")
    if not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5) or int(port_text) > 65535:
        raise ValueError(f"port '{port_text[:12]}' in {shown(value)} must be a number from 0 to 65535")
    if host:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if not all(part.isalnum() or "-" in part for part in host.split(".")):
                raise ValueError(f"host {shown(host)} in {shown(value)} is neither an IP address nor a host name") from None
    return host, int(port_text)


class Settings(BaseSettings):
    """Every knob of the agent. Field names are the YAML keys; ``ROOFWATCH_<NAME>`` overrides."""

    model_config = SettingsConfigDict(env_prefix="ROOFWATCH_", env_nested_delimiter="__", extra="forbid",
                                      validate_default=True)

    backend: Literal["auto", "nvml", "amd", "virtual", "nvml-virtual", "amd-virtual", "dcgm-exporter",
                     "amd-exporter"] = Field(
        "auto", description="Telemetry source: auto tries NVML, then AMD; virtual runs the simulated fleet; "
        "nvml-virtual / amd-virtual run the NVML / AMD backend over a fake driver library that plays the simulated "
        "fleet (amd-virtual defaults to the mi300x scenario); dcgm-exporter reads the GPUs from a dcgm-exporter's "
        "/metrics alone (dcgm_exporter_url; docs/nvidia.md); amd-exporter from AMD's Device Metrics Exporter alone "
        "(amd_exporter_url; docs/amd.md)."
    )
    driver_wait_s: float = Field(
        0.0, ge=0.0, le=86_400.0, description="How long `run` waits for the GPU driver when none answers at "
        "start (a node still installing it), serving /healthz and retrying with back-off; 0 = exit at once "
        "with the reason (the systemd unit sets 120, then restarts the agent).")
    listen: str = Field(f":{DEFAULT_PORT}", description="HTTP listen address HOST:PORT (empty host = all interfaces).")
    web_config_file: str | None = Field(
        None, min_length=1, description="Prometheus exporter-toolkit web config: TLS (mTLS optional) and bcrypt "
        "basic auth for the HTTP port (docs/security.md); unset = plain HTTP, no auth.")
    allow_security_downgrade: bool = Field(
        False, description="Let a reload (SIGHUP) turn basic auth or TLS off, or lower the client-certificate "
        "check. Off: such a reload is refused and the running web config stays, since an emptied or cut-off "
        "file (a Secret being rewritten) looks the same as an intended change; set it in the new settings "
        "when the change is meant (docs/security.md).")
    http_header_timeout_s: float = Field(
        10.0, gt=0.0, le=300.0, description="HTTP port: seconds a client gets from connecting (TLS handshake "
        "included), or from the first byte of a later request, to the end of its request headers; then 408 and "
        "close (docs/reliability.md, hostile clients).")
    http_idle_timeout_s: float = Field(
        120.0, gt=0.0, le=3600.0, description="HTTP port: a keep-alive connection with no request in progress "
        "is closed after this many seconds (keep it above the scrape interval).")
    http_max_connections: int = Field(
        1024, ge=1, le=65_536, description="HTTP port: open connections in all; at the cap the oldest one with "
        "no request in progress is closed to make room.")
    http_max_connections_per_client: int = Field(
        64, ge=1, le=65_536, description="HTTP port: open connections from one address; past it new ones from "
        "that address are closed on arrival.")
    http_max_in_flight: int = Field(
        64, ge=1, le=4096, description="HTTP port: requests answered at once; past it, 503 at once.")
    interval_s: float = Field(1.0, ge=0.05, le=60.0, description="Seconds between collection cycles.")
    sample_timeout_s: float | None = Field(
        None, gt=0.0, le=60.0, description="Deadline for one device read; default 0.8 x interval."
    )
    history_len: int = Field(600, ge=10, le=100_000, description="Samples kept per GPU for classification windows.")
    node_name: str = Field(default_factory=socket.gethostname, min_length=1, description="Value of the node label.")
    expected_gpus: int | None = Field(
        None, ge=0, le=1024, description="GPUs this node should have; default: as many as were discovered."
    )
    max_devices: int = Field(
        128, ge=1, le=1024, description="GPUs and MIG instances taken from the source at most (a node has at most "
        "16 GPUs x 7 MIG instances); a source that lists more (a dcgm-exporter URL that is not this node's) has the "
        "rest refused with one warning and a doctor finding (docs/reliability.md).")
    stale_after_s: float | None = Field(
        None, gt=0.0, le=86_400.0, description="/healthz fails when the snapshot is older; default max(10 s, 5 "
        "intervals).")
    sysfs_root: str = Field(
        "/sys", min_length=1, description="Where the host's sysfs is mounted: InfiniBand/RoCE counters and the "
        "PCIe tree that maps each GPU to its nearest NIC (in a container, the host's /sys mounted read-only)."
    )
    max_processes_per_gpu: int = Field(16, ge=0, le=1024, description="Per-process series kept per GPU (largest first).")
    max_holders_per_gpu: int = Field(4, ge=1, le=64, description="Holders of a shared GPU with series of their own "
                                     "(largest SM or memory share first); the rest are summed as `other`.")
    gpu_labels: list[Literal["job_id", "namespace", "pod", "container"]] = Field(
        default_factory=list, description="Attribution labels copied onto every GPU series (opt-in: each one adds "
        "series churn whenever jobs or pods change); roofwatch_gpu_job_info and roofwatch_gpu_pod_info always carry them.")
    optional_metrics: list[Literal["scores", "pipes", "roofline_detail", "one_hot_zeros", "fabric_links"]] = Field(
        default_factory=list, description="Series left out by default because no shipped panel, rule or alert reads "
        "them (docs/metrics.md, \"Opt-in series\"): scores (each class's score), pipes (each math and tensor pipe), "
        "roofline_detail (ridge point, roof headroom, peak FLOP/s of every precision), one_hot_zeros (the 0 series "
        "of the workload class and clock-event one-hots), fabric_links (bytes per XGMI link).")
    kubelet_socket: str | None = Field(
        "/var/lib/kubelet/pod-resources/kubelet.sock", description="kubelet pod-resources socket for pod/namespace/"
        "container attribution; used when it exists (or when set explicitly); empty disables it.")
    kubelet_refresh_s: float = Field(10.0, ge=1.0, le=3600.0, description="Seconds between pod-resources List calls.")
    inference_endpoints: list[InferenceEndpoint] = Field(
        default_factory=list, max_length=64, description="Inference servers (vLLM, SGLang, TGI) whose Prometheus "
        "metrics give workload MFU/MBU without code changes (see docs/attribution.md); each is read by its own "
        "thread, so at most 64.")
    models: dict[str, ModelFacts] = Field(
        default_factory=dict, max_length=1024, description="Facts about served models by the name their server "
        "reports (vLLM/SGLang model_name): model_bytes, params, dtype, kv_cache_bytes, max_running (docs/serving.md).")
    inference_interval_s: float = Field(5.0, ge=0.5, le=300.0, description="Seconds between scrapes of each "
                                        "inference endpoint; reports older than 3 intervals are dropped.")
    inference_timeout_s: float = Field(2.0, gt=0.0, le=30.0, description="Deadline for one inference endpoint scrape.")
    dcgm: Literal["auto", "on", "off"] = Field(
        "auto", description="Read DCGM profiling counters (SM, tensor, DRAM, FP-pipe activity) for NVIDIA GPUs "
        "without GPM (before Hopper) through the DCGM Python bindings, joined into the NVML samples. auto: when "
        "such GPUs exist and DCGM answers (else NVML alone, doctor says why); on: required; off: never. "
        "nvml-virtual: only with on (a simulated host engine).")
    dcgm_host: str = Field(
        "localhost:5555", min_length=1, description="The DCGM host engine (nv-hostengine) to connect to: "
        "HOST[:PORT] (default port 5555), unix:/path/to/socket, or embedded (start DCGM inside the agent; "
        "profiling then needs the agent to run as root).")
    dcgm_bindings_path: list[str] = Field(
        default_factory=lambda: ["/usr/share/datacenter-gpu-manager-4/bindings/python3",
                                 "/usr/local/dcgm/bindings/python3"],
        description="Directories searched, in order, for the DCGM Python bindings (dcgm_agent.py), which ship "
        "with the DCGM packages (DCGM 4 and DCGM 3 install paths by default).")
    dcgm_exporter_url: str | None = Field(
        None, min_length=1, description="A dcgm-exporter's /metrics URL (http://127.0.0.1:9400/metrics): with the "
        "NVML backend it fills the profiling counters NVML lacks before Hopper (SM, tensor, FP pipes, DRAM) for the "
        "GPU with the same UUID; with backend dcgm-exporter it is the only source (docs/nvidia.md).")
    dcgm_exporter_interval_s: float = Field(5.0, ge=0.2, le=300.0, description="Seconds between reads of "
                                            "dcgm_exporter_url, in the background (never inside a scrape).")
    dcgm_exporter_timeout_s: float = Field(2.0, gt=0.0, le=30.0, description="Deadline for one read of "
                                           "dcgm_exporter_url, the whole body included.")
    dcgm_exporter_stale_s: float = Field(
        120.0, ge=1.0, le=86_400.0, description="dcgm-exporter values count as stale (GPUs down) when the last good "
        "read, the exporter's own sample timestamps, or a powered GPU's energy counter are older than this "
        "(dcgm-exporter refreshes every 30 s by default).")
    amd_exporter_url: str | None = Field(
        None, min_length=1, description="An AMD Device Metrics Exporter's /metrics URL (http://127.0.0.1:5000/metrics): "
        "with backend amd-exporter it is the only source; with amd or amd-virtual its profiler series (tensor (MFMA), "
        "VALU and HBM counters) are joined to amdsmi's samples by board serial and partition (docs/amd.md).")
    amd_exporter_interval_s: float = Field(5.0, ge=0.2, le=300.0, description="Seconds between reads of "
                                           "amd_exporter_url, in the background (the exporter caches 15 s).")
    amd_exporter_timeout_s: float = Field(2.0, gt=0.0, le=30.0, description="Deadline for one read of "
                                          "amd_exporter_url, the whole body included.")
    amd_exporter_stale_s: float = Field(
        120.0, ge=1.0, le=86_400.0, description="Device Metrics Exporter values count as stale (GPUs down) when the "
        "last good read, its own sample timestamps, or a powered GPU's energy counter are older than this.")
    amd_exporter_profiler_window_us: float = Field(
        1000.0, ge=1.0, le=60_000_000.0, description="The exporter's profiler sampling window in microseconds, which "
        "/metrics does not say: 1000 from DME 1.4.1 (1.5: ProfilerConfig.SamplingInterval); 1.3.x-1.4.0.1 used 10, "
        "too short for a rate. Profiler counts over it become FLOP/s and HBM bytes/s (docs/amd.md).")
    otlp_endpoint: str | None = Field(
        None, min_length=1, description="Push every metric over OTLP to this collector as well (docs/otlp.md): "
        "http/protobuf a base URL, /v1/metrics appended (http://otel-collector:4318); grpc http(s)://HOST:4317. "
        "Unset: OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT when set, else no push. /metrics stays either way.")
    otlp_protocol: Literal["http/protobuf", "grpc"] | None = Field(
        None, description="OTLP transport; default OTEL_EXPORTER_OTLP_[METRICS_]PROTOCOL, else http/protobuf.")
    otlp_interval_s: float = Field(10.0, ge=1.0, le=3600.0, description="Seconds between OTLP pushes of the "
                                   "latest snapshot.")
    otlp_timeout_s: float | None = Field(
        None, gt=0.0, le=300.0, description="Deadline of one OTLP push, retries included; default "
        "OTEL_EXPORTER_OTLP_[METRICS_]TIMEOUT (milliseconds, as the OpenTelemetry specification says), else 10 s.")
    otlp_headers: dict[str, str] = Field(
        default_factory=dict, max_length=64, description="Headers on every OTLP push (API keys, tenant ids), over "
        "OTEL_EXPORTER_OTLP_[METRICS_]HEADERS; a mapping, or key=value,key2=value2 as in that variable.")
    otlp_queue_size: int = Field(6, ge=1, le=1000, description="Snapshots waiting for a slow OTLP collector at "
                                 "most; then the oldest is dropped and counted (roofwatch_otlp_dropped_batches_total).")
    report_socket: str | None = Field(
        None, description="Unix socket for workload reports (agent.client looks for /run/roofwatch/report.sock); "
        "unset = no socket.")
    report_socket_mode: int = Field(0o666, ge=0, le=0o777, description="File mode of the report socket "
                                    "(YAML: 0o660 or 432); anyone who can open it may report unless a token is set.")
    report_http: bool = Field(True, description="Accept POST /api/v1/report on the HTTP port (loopback clients "
                              "only, unless a report token is set).")
    report_token: str | None = Field(None, min_length=8, description="Bearer token every report must carry "
                                     "(also lets non-loopback HTTP clients report).")
    report_token_file: str | None = Field(None, min_length=1, description="Read the report token from this file "
                                          "(e.g. a mounted Secret); excludes report_token.")
    report_rate_per_s: float = Field(200.0, gt=0.0, le=100_000.0, description="Reports a second each client may "
                                     "send (each process on the socket; each address over HTTP, so local HTTP "
                                     "reporters share one), in bursts of twice that; past it: 429 with Retry-After, "
                                     "and the body is not parsed.")
    report_ttl_s: float = Field(30.0, gt=0.0, le=3600.0, description="How long a workload report counts after it arrives.")
    scenario: str = Field("demo", min_length=1, description="Virtual backend: built-in scenario name or YAML path.")
    virtual_node: str | None = Field(None, description="Virtual backend: which scenario node this agent plays.")
    dtype: Dtype = Field("bf16", description="Math precision assumed for peak FLOP/s when the workload does not say.")
    specs: dict[str, dict[str, float | str]] = Field(
        default_factory=dict, max_length=256, description="Dense peaks for GPU models the catalogue lacks, keyed by "
        "the exact name the driver reports (nvidia-smi / amd-smi): bf16_tflops, fp16_tflops, fp8_tflops, tf32_tflops, "
        "fp32_tflops, fp64_tflops, mem_bandwidth_tbs, memory_gib, tdp_w, sm_count, ref_clock_mhz; wins over the "
        "catalogue (roofwatch doctor prints the entry to add).")
    classify: bool = Field(True, description="Classify each GPU's workload and export verdicts, MFU and MBU.")
    classifier: Thresholds = Field(
        default_factory=Thresholds, description="Classifier thresholds and windows (see docs/classification.md)."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log verbosity.")
    log_format: Literal["logfmt", "json"] = Field("logfmt", description="Structured log line format on stderr.")

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        parse_listen(value)
        return value

    @field_validator("dcgm_exporter_url", "amd_exporter_url")
    @classmethod
    def _check_dcgm_exporter_url(cls, value: str | None) -> str | None:
        if value is not None and not (value.startswith(("http://", "https://")) and len(value) > 8):
            raise ValueError(f"{safe_url(value, 60)} is not an http:// or https:// URL (for example "
                             "http://127.0.0.1:9400/metrics)")
        if value is not None and "@" in value.split("//", 1)[1].split("/", 1)[0]:  # the reader sends no basic auth
            raise ValueError(f"{safe_url(value, 60)} carries a user:password@, which the exporter reader never sends "
                             "(it would be read as part of the host name); an exporter on this node needs none")
        return value

    @field_validator("otlp_endpoint")
    @classmethod
    def _check_otlp_endpoint(cls, value: str | None) -> str | None:
        if value is not None and not (value.startswith(("http://", "https://")) and len(value) > 8):
            raise ValueError(f"{safe_url(value, 60)} is not an http:// or https:// URL (for example "
                             "http://otel-collector:4318)")
        return value

    @field_validator("otlp_headers", mode="before")
    @classmethod
    def _check_otlp_headers(cls, value: Any) -> Any:
        from exporters.otlp import headers  # one rule for every source of a header; no value in any message

        if isinstance(value, str):  # key=value,key2=value2, the OTEL_EXPORTER_OTLP_HEADERS form
            value = dict(headers.split_pairs(value))
        if isinstance(value, dict):
            headers.check(value)
        return value

    @field_validator("specs")
    @classmethod
    def _check_specs(cls, value: dict[str, dict[str, float | str]]) -> dict[str, dict[str, float | str]]:
        from agent.model.specs.override import override_spec

        for name, fields in value.items():
            override_spec(name, fields)  # ValueError names the model and the field
        return value

    @model_validator(mode="after")
    def _one_token_source(self) -> "Settings":
        if self.report_token and self.report_token_file:
            raise ValueError("report_token and report_token_file are exclusive: set one")
        return self

    @property
    def reports_enabled(self) -> bool:
        return bool(self.report_socket) or self.report_http

    def read_report_token(self) -> str | None:
        """The report token, read from ``report_token_file`` when set (stripped); ConfigError if unreadable."""
        if not self.report_token_file:
            return self.report_token
        try:  # a regular file only: /dev/zero would be read forever, a FIFO would block the start
            token = read_text_file(self.report_token_file, f"report_token_file: {self.report_token_file}",
                                   "token file", MAX_TOKEN_FILE_BYTES).strip()
        except FileInputError as exc:
            raise ConfigError(str(exc)) from None
        if len(token) < 8:
            raise ConfigError(f"report_token_file: {self.report_token_file} holds fewer than 8 characters")
        return token

    @property
    def listen_address(self) -> tuple[str, int]:
        return parse_listen(self.listen)

    @property
    def effective_stale_after_s(self) -> float:
        return self.stale_after_s if self.stale_after_s is not None else max(10.0, 5.0 * self.interval_s)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        data = _config_data.get()
        if data is not None:  # read once by load_settings: no second parse, no second look at the path
            sources.append(InitSettingsSource(settings_cls, init_kwargs=data))
        return tuple(sources)


SECRET_SETTINGS = frozenset({"otlp_headers", "otlp_endpoint", "report_token", "dcgm_exporter_url", "amd_exporter_url"})
"""Settings whose value is never echoed in an error (header values, a URL's user:password@ and query)."""
MAX_ERRORS_SHOWN = 5
"""Errors one message names; the rest are counted (an environment value can hold a thousand bad keys)."""


def _describe(error: dict[str, Any], listed: set[str] | None = None) -> str:
    """One error as ``setting: what is wrong (got value)``; the valid names of a scope are listed once
    per message (``listed`` remembers which), not once per unknown key."""
    field = ".".join(printable_name(part) for part in error.get("loc", ())) or "(settings)"
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    if error.get("type") == "extra_forbidden":
        loc = error.get("loc", ())
        nested = {"classifier": Thresholds.model_fields, "inference_endpoints": InferenceEndpoint.model_fields,
                  "models": ModelFacts.model_fields}
        scope = str(loc[0]) if len(loc) > 1 and str(loc[0]) in nested else ""
        valid = nested.get(scope, Settings.model_fields)
        if listed is not None and scope in listed:
            return f"{field}: unknown setting"
        if listed is not None:
            listed.add(scope)
        return f"{field}: unknown setting (valid settings: {', '.join(sorted(valid))})"
    given = error.get("input")
    got = "" if isinstance(given, dict) or "(got " in message else f" (got {shown(given)})"  # never 4301 digits
    if (error.get("loc") or ("",))[0] in SECRET_SETTINGS:  # a model validator's error has an empty loc
        got = ""  # its value may be a credential: the message names the setting and what is wrong, never the value
    env_name = "ROOFWATCH_" + "__".join(str(part) for part in error.get("loc", ())).upper()
    if os.environ.get(env_name) is not None and str(given) == os.environ[env_name]:
        got += f" from {env_name}"
    return f"{field}: {message}{got}"


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        data = read_config_file(path)  # a regular file, bounded, UTF-8, YAML within its budget; one line
    except ConfigInputError as exc:
        raise ConfigError(str(exc)) from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"config file {path}: must be a mapping of setting: value, got {type(data).__name__}")
    return data or {}


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build settings; ``overrides`` are the flags the user actually passed (``None`` = not given)."""
    path = Path(config_file) if config_file else None
    token = _config_data.set(_read_config_file(path) if path is not None else None)
    try:
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
        remember_secrets(settings)  # no log line, error or doctor report of this process shows them (docs/security.md)
        return settings
    except ValidationError as exc:
        errors, listed = exc.errors(), set()
        details = "; ".join(_describe(e, listed) for e in errors[:MAX_ERRORS_SHOWN])
        if len(errors) > MAX_ERRORS_SHOWN:
            details += f" (and {len(errors) - MAX_ERRORS_SHOWN} more)"
        source = f" (config file {path})" if path else ""
        raise ConfigError(f"invalid configuration{source}: {details}") from None
    except SettingsError as exc:  # an environment value that is not the JSON a list or mapping setting takes
        raise ConfigError(f"invalid configuration: {describe_environment_error(exc, 'ROOFWATCH_')}") from None
    finally:
        _config_data.reset(token)
