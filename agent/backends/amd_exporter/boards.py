"""Board part numbers (DME's ``card_model``) -> the market name the peak-spec catalogue knows.

gpuagent fills ``card_model`` with amdsmi's ``amdsmi_get_gpu_board_info().model_number`` and the optional
``card_series`` with its ``product_name`` (ROCm/gpu-agent@52879d9 ``sw/nic/gpuagent/api/smi/amdsmi/smi_api.cc:761-768``).
A model number is the board's part number plus a revision suffix (``102-G30211-0C``); the catalogue holds market
names, so the numbers seen in published material are listed here by their base part number (``102-G30211``) and
any revision suffix matches. A board not listed is resolved by its printed name, or by a ``specs:`` entry keyed by
the exact ``card_model`` value, which ``roofwatch doctor`` prints ready to paste.
"""

from __future__ import annotations

import re

BOARD_MODELS: dict[str, str] = {
    # ROCm/device-metrics-exporter PR #329: an MI300X exposition, card_model="102-G30211-0C".
    "102-G30211": "AMD Instinct MI300X",
    # ROCm/device-metrics-exporter issue #495: "AMD Instinct MI355X OAM (102-G36218-0C, PCI device-id 75a3)".
    "102-G36218": "AMD Instinct MI355X",
    # ROCm/rocm-systems PR #2987: amd-smi static on an MI350X (device id 0x75a0): MODEL_NUMBER 102-G36212-0C.
    "102-G36212": "AMD Instinct MI350X",
    # ROCm/ROCm issue #2852 (legacy-rocm-build mirror): two owners of MI250X OAMs (HPE Cray EX235a) read the
    # board as "102-D65201"; the revision suffix amdsmi appends is not published, hence the base-number match.
    "102-D65201": "AMD Instinct MI250X",
}
"""Base part number -> market name. Sources in the comments; docs/amd.md lists them too."""

_PART = re.compile(r"(\d{3}-[A-Z0-9]{6})(?:-[A-Z0-9]{1,4})?")


def base_part(value: str) -> str | None:
    """``102-G30211-0C`` -> ``102-G30211``; None for a value that is not a board part number."""
    match = _PART.fullmatch(value.strip().upper())
    return match.group(1) if match else None


def board_model(value: str | None) -> str | None:
    """The market name of board part number ``value`` (any revision suffix), or None when not listed."""
    if not value:
        return None
    part = base_part(value)
    return BOARD_MODELS.get(part) if part else None
