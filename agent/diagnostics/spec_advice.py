"""The doctor line for a GPU model without catalogued peaks: what is lost, and the config entry to add.

An uncatalogued model still gets verdicts (activity ratios need no peak) but MFU, achieved FLOP/s,
the roofline position and ridge points read unknown. The fix is the ``specs:`` section of the
config, keyed by the exact name the driver reported, so the line prints that name ready to paste.
"""

from __future__ import annotations

import json
from typing import Any

from agent.diagnostics.findings import Finding
from agent.model.specs import mig_profile

IMPACT = ("MFU, achieved FLOP/s, the roofline position and ridge points of this model (verdicts still work: "
          "activity ratios need no peak)")


def config_snippet(model: str) -> str:
    """The YAML to add, with the driver's model name quoted exactly (a valid YAML line once filled in)."""
    return (f"specs: {{{json.dumps(model)}: {{bf16_tflops: <dense TFLOP/s>, fp32_tflops: <TFLOP/s>, "
            "mem_bandwidth_tbs: <TB/s>}}")


def spec_finding(model: str, spec: Any, gpu: str, seen: set[str]) -> Finding | None:
    """A warning when ``model`` has no catalogued FLOP peaks (once per model name), else None.

    A MIG instance is named after its parent GPU plus the profile; the override is keyed by the
    parent's name, since the instance's peaks are scaled from it.
    """
    name = (mig_profile(model) or (model,))[0]
    if name in seen:
        return None
    if spec is not None and not spec.estimated and spec.peak_flops:
        return None
    seen.add(name)
    if spec is None:
        detail = f"{name} is not in the peak-spec catalogue (roofwatch specs)"
    elif spec.estimated:
        detail = f"{name} is not in the peak-spec catalogue: peaks estimated from the driver, no tensor peaks"
    else:
        detail = f"{name} is catalogued ({spec.key}) without FLOP peaks: none could be sourced"
    fix = ("add its dense datasheet peaks (no sparsity) to the config file and restart the agent: "
           + config_snippet(name))
    return Finding("peak specs", "warn", detail, IMPACT, fix, gpu=gpu)
