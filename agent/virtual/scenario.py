"""Scenario files for the virtual GPU engine: what runs where, and when.

A scenario is a YAML document validated by pydantic models: the phases and workloads of
:mod:`agent.virtual.workloads`, the nodes and faults of :mod:`agent.virtual.nodes` (with the
driver profiles of :mod:`agent.virtual.profiles`) and the fleet-wide :class:`Scenario` below,
which checks what no single node can see (a job's ranks across nodes). This module also loads
and resolves scenario files. Validation is strict (``extra="forbid"``) because a scenario is
hand-written and a silently ignored typo (``mfuu: 0.9``) would make the demo or a test quietly
simulate something else. Every error is reported as ``<file>: <field.path>: <message>`` so the
user can find the offending line.

Example::

    name: tiny
    seed: 7
    nodes:
      - name: node-a
        model: h100-sxm            # a key of agent.model.specs
        gpus: 2
        workloads:
          - job: train
            gpus: [0]
            phases:
              - {kind: compute, duration_s: 60, mfu: 0.45}
              - {kind: idle, duration_s: 10}
        faults:
          - {gpu: 1, kind: error, start_s: 5, duration_s: 3}

Top-level keys starting with ``x-`` are ignored, so they can hold YAML anchors shared by the
workloads of a job that spans several nodes (its ranks must run the same phases).

A node may also set ``counters`` (what a real backend can read there: ``full``, ``amdsmi``,
``nvml_basic``, ``minimal``; default by model) and ``mig`` (``{0: [3g.40gb, 3g.40gb]}``: GPU 0 is
replaced by two MIG instances that workloads and faults name ``"0/1"`` and ``"0/2"``), and
``nvml`` (:class:`~agent.virtual.profiles.NvmlProfile`: how the fake NVIDIA driver of
:mod:`agent.virtual.fake_nvml` behaves there: driver version, permissions, unsupported symbols
and fields). An AMD node may set ``amd`` (:class:`~agent.virtual.profiles.AmdProfile`): its
compute and memory partition modes (with ``CPX`` each MI300X becomes eight devices that
workloads and faults name ``"0/0"`` .. ``"0/7"``, the partition id KFD reports) and how its fake
libamd_smi (:mod:`agent.virtual.fake_amdsmi`) behaves.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator

from agent.context.file_input import FileInputError, read_text_file
from agent.context.yaml_input import YamlInputError, load_yaml
from agent.virtual.nodes import Node
from agent.virtual.workloads import PHASE_KINDS, CommJitterPhase, StrictModel, Workload

BUILTIN_SCENARIOS: tuple[str, ...] = ("demo", "cluster", "mi300x", "mi300x-dme", "fleet", "serving", "shared",
                                      "a100-dcgm-counters")
"""Scenarios shipped in ``agent/virtual/scenarios/<name>.yaml``."""


class ScenarioError(ValueError):
    """A scenario file that cannot be used; the message names the file and the field path."""


class Scenario(StrictModel):
    """A whole simulated fleet."""

    name: str = Field(min_length=1)
    seed: int = 0
    description: str = ""
    nodes: list[Node] = Field(min_length=1)

    @model_validator(mode="after")
    def _jobs_consistent(self) -> "Scenario":
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"nodes: duplicate node names in {names}")
        first: dict[str, tuple[str, Workload]] = {}
        world: dict[str, int] = {}
        for n_i, node in enumerate(self.nodes):
            for w_i, workload in enumerate(node.workloads):
                world[workload.job] = world.get(workload.job, 0) + len(workload.gpus)
                where = f"nodes.{n_i}.workloads.{w_i}"
                if workload.job not in first:
                    first[workload.job] = (where, workload)
                    continue
                ref_where, ref = first[workload.job]
                if ref.phases != workload.phases or ref.repeat != workload.repeat or ref.dtype != workload.dtype:
                    raise ValueError(
                        f"{where}: job {workload.job!r} also runs at {ref_where} with different "
                        "phases/repeat/dtype; the ranks of one job must run the same schedule (use a YAML anchor)"
                    )
        for job, (where, workload) in first.items():
            if workload.serving is not None and world[job] > len(workload.gpus):
                raise ValueError(f"{where}: serving job {job!r} runs on more than one node; a serving replica is "
                                 "simulated on one node")
            for p_i, phase in enumerate(workload.phases):
                if isinstance(phase, CommJitterPhase) and world[job] < 2:
                    raise ValueError(
                        f"{where}.phases.{p_i}.kind: comm_jitter needs a job with at least 2 GPUs; {job!r} has 1"
                    )
                rank = getattr(phase, "straggler_rank", None)
                if rank is not None and rank >= world[job]:
                    raise ValueError(
                        f"{where}.phases.{p_i}.straggler_rank: {rank} but job {job!r} has {world[job]} ranks"
                    )
        return self

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)


# ----------------------------------------------------------------------------- loading


def _format_loc(loc: tuple[int | str, ...]) -> str:
    """Dotted field path, without pydantic's union-tag steps (``phases.0.compute.mfu``)."""
    parts: list[str] = []
    for i, item in enumerate(loc):
        if isinstance(item, str) and item in PHASE_KINDS and i > 0 and isinstance(loc[i - 1], int):
            continue
        parts.append(str(item))
    return ".".join(parts)


_SUBPATH = re.compile(r"^([A-Za-z_]\w*(?:\.\w+)*): (.*)$", re.DOTALL)


def _format_error(source: str, exc: ValidationError) -> str:
    """One line per problem: ``<source>: <dotted.path>: <message>``.

    Cross-field validators report the rest of the path at the start of their message
    (``workloads.1.gpus: ...``); it is joined onto pydantic's location so the user sees one path.
    """
    lines = []
    for err in exc.errors():
        msg = err["msg"].removeprefix("Value error, ")
        loc = _format_loc(tuple(err["loc"]))
        match = _SUBPATH.match(msg)
        if match:
            loc = f"{loc}.{match.group(1)}" if loc else match.group(1)
            msg = match.group(2)
        lines.append(f"{source}: {loc}: {msg}" if loc else f"{source}: {msg}")
    return "\n".join(lines)


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate an already-parsed document (a dict, as from YAML) into a :class:`Scenario`."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    # Top-level ``x-*`` keys are free (as in docker-compose): a place for YAML anchors.
    data = {k: v for k, v in data.items() if not (isinstance(k, str) and k.startswith("x-"))}
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(_format_error(source, exc)) from None


def _parse_text(text: str, source: str) -> Scenario:
    try:  # the agent's one YAML loader: anchors are welcome here, an alias bomb is refused as it composes
        data = load_yaml(text, source)
    except YamlInputError as exc:
        raise ScenarioError(str(exc)) from None
    return parse_scenario(data, source)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; raises :class:`ScenarioError` naming file and field."""
    try:  # a regular file of at most a MiB: a FIFO or /dev/zero is named, never opened blocking or read
        text = read_text_file(path, f"{path}: cannot read scenario", "scenario")
    except FileInputError as exc:
        raise ScenarioError(str(exc)) from None
    return _parse_text(text, str(path))


def builtin_scenario(name: str) -> Scenario:
    """One of :data:`BUILTIN_SCENARIOS`, read from the installed package."""
    if name not in BUILTIN_SCENARIOS:
        raise ScenarioError(f"unknown built-in scenario {name!r}; built-in: {', '.join(BUILTIN_SCENARIOS)}")
    text = resources.files("agent.virtual").joinpath("scenarios", f"{name}.yaml").read_text(encoding="utf-8")
    return _parse_text(text, f"{name}.yaml")


def resolve_scenario(name_or_path: str | Path) -> Scenario:
    """A built-in scenario by name, otherwise a YAML file path (what ``--scenario`` accepts)."""
    if isinstance(name_or_path, str) and name_or_path in BUILTIN_SCENARIOS:
        return builtin_scenario(name_or_path)
    return load_scenario(name_or_path)
