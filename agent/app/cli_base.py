"""What every ``roofwatch`` command shares: exit statuses, the one-line error, and the settings flags.

Exit status: 0 success, 1 runtime failure (no GPU backend, port in use, trace not writable),
2 bad configuration or usage. Errors meant for a person are printed without a traceback.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from agent.app.config import DEFAULT_PORT, ConfigError, Settings, load_settings

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


DEMO_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"


BACKENDS = ("auto", "nvml", "amd", "virtual", "nvml-virtual", "amd-virtual", "dcgm-exporter", "amd-exporter")


DEMO_BACKENDS = ("virtual", "nvml-virtual", "amd-virtual")


class CliError(Exception):
    """A failure to report in one line and exit with ``code``."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


def add_settings_flags(parser: argparse.ArgumentParser, *, backend: bool = True, listen: bool = True) -> None:
    """Flags that map onto :class:`Settings` fields; unset flags stay ``None`` so env/file win."""
    group = parser.add_argument_group("settings (flags override ROOFWATCH_* variables, which override --config)")
    group.add_argument("--config", metavar="FILE", help="YAML settings file (default: $ROOFWATCH_CONFIG)")
    if backend:
        group.add_argument("--backend", choices=list(BACKENDS), help="telemetry source (default auto)")
    if listen:
        group.add_argument("--listen", metavar="HOST:PORT", help=f"HTTP listen address (default :{DEFAULT_PORT})")
        group.add_argument("--web-config-file", metavar="FILE",
                           help="exporter-toolkit web config: TLS and basic auth for the HTTP port (docs/security.md)")
    group.add_argument("--interval", dest="interval_s", type=float, metavar="SECONDS", help="collection interval (default 1)")
    group.add_argument("--node-name", metavar="NAME", help="node label value (default: host name)")
    group.add_argument("--expected-gpus", type=int, metavar="N", help="GPUs this node should have")
    group.add_argument("--scenario", metavar="NAME|FILE", help="virtual backend scenario (default demo)")
    group.add_argument("--virtual-node", metavar="NAME", help="which scenario node to play (virtual backend)")
    group.add_argument("--dtype", choices=["fp8", "bf16", "fp16", "tf32", "fp32", "fp64"],
                       help="precision behind the peak FLOP/s when the workload does not say (default bf16, flagged as assumed)")
    group.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    group.add_argument("--log-format", choices=["logfmt", "json"])


def settings_from(args: argparse.Namespace, **forced: Any) -> Settings:
    """Settings from --config (or $ROOFWATCH_CONFIG), the environment and the flags that were given."""
    names = set(Settings.model_fields)
    overrides = {k: v for k, v in vars(args).items() if k in names}
    overrides.update(forced)
    config = getattr(args, "config", None) or os.environ.get("ROOFWATCH_CONFIG")
    try:
        return load_settings(config, **overrides)
    except ConfigError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
