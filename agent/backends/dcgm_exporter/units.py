"""Each family of one exposition in its field's canonical unit, its magnitude checked, and why, for ``doctor``.

The name a series is printed under says a unit (:mod:`agent.backends.dcgm_exporter.names`): the field's own
(MHz, mJ, MiB, percent), or a base unit from DCGM 4.7's names (Hz, J, bytes, a ratio). That is the first
guess, converted to the canonical unit. Then the magnitudes of the whole family (every GPU's value) are
checked, because re-exporters and releases have printed units other than their names say:

* a profiling ratio above 1.5 anywhere in a family is a percentage (``DCGM_FI_PROF_*`` are 0..1);
* a utilisation (int64 percent in DCGM) under a ratio name with a value above 1.5 is still a percent;
  ``DCGM_FI_DEV_GPU_UTIL_RATIO`` printed with a decimal point (``%f``: DCGM 4.7's double; any fraction is) is
  a ratio, printed as whole numbers 0 or 1 it is DCGM 4.6's int64 percent;
* an SM clock above 100,000 is in Hz, not MHz (no GPU clocks at 100 GHz); one under a Hz name below 100,000
  is MHz (no GPU runs at 100 kHz);
* framebuffer sizes above 10,000,000 are bytes, not MiB (10 TiB of device memory does not exist); under a
  bytes name, a family whose values are all below 1 MiB but not all zero is MiB.

Every conversion that the name alone does not explain is said once per family (``units``), and every name
read by its stem (an assumption) is said with its magnitude (``notes``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.backends.dcgm_exporter.names import (
    CLOCKS_MHZ,
    FRAMEBUFFER_MIB,
    PERCENTS,
    PROFILING_RATIOS,
    SAME,
    TYPED_BY_PRINT,
    UNITS,
    Name,
    Scale,
    factor,
)

RATIO_AS_PERCENT_ABOVE = 1.5
HZ_ABOVE = 100_000.0
BYTES_ABOVE = 10_000_000.0
MIB = 2**20


@dataclass(slots=True)
class Family:
    """Every value one exposition printed under one name (upper-cased), and how they were printed."""

    spelled: str
    read: Name
    values: list[float] = field(default_factory=list)
    decimal: bool = False
    """Some value was printed with a decimal point or an exponent (a DCGM double, as dcgm-exporter prints one)."""

    def add(self, value: float, decimal: bool) -> None:
        self.values.append(value)
        self.decimal = self.decimal or decimal


@dataclass(frozen=True, slots=True)
class Decision:
    """How the family's values are scaled, why where the name alone does not say it, and what was assumed."""

    scale: Scale = SAME
    unit_note: str | None = None
    assumed: str | None = None

    def apply(self, value: float) -> float:
        multiplier, divisor = self.scale
        return value if (multiplier, divisor) == SAME else value * multiplier / divisor


def family_factor(family: Family) -> Decision:
    """How ``family`` is put in its field's canonical unit, with the reason where magnitudes moved it."""
    name, read, values = family.spelled, family.read, family.values
    guess = factor(read.unit, read.field) or SAME
    top = max(values) if values else 0.0
    decision = _checked(name, read, guess, top, family.decimal)
    if not read.by_stem:
        return decision
    unit = read.unit or UNITS.get(read.field, "its field's unit")
    shown = f"{decision.apply(top):g} {UNITS.get(read.field, '')}".rstrip()
    assumed = (f"{name} is no name this roofwatch knows: read as {read.field} by its stem, in {unit} by its "
               f"suffix; values up to {top:g} read as {shown}")
    return Decision(decision.scale, decision.unit_note, assumed)


def _checked(name: str, read: Name, guess: Scale, top: float, decimal: bool) -> Decision:
    """The name's scale, unless the family's magnitudes say another unit (the module's rules)."""
    field, (mul, div) = read.field, guess
    scaled = top * mul / div
    if field in PROFILING_RATIOS and scaled > RATIO_AS_PERCENT_ABOVE:
        return Decision((mul, div * 100), f"{name} reads up to {top:g}: a percentage, read as a ratio 0..1")
    if field in PERCENTS and read.unit == "ratio" and top > RATIO_AS_PERCENT_ABOVE:
        return Decision(SAME, f"{name} reads up to {top:g}: a percent under a ratio name, read as percent")
    if name in TYPED_BY_PRINT and top <= RATIO_AS_PERCENT_ABOVE and decimal:
        return Decision((100, 1))  # printed as a DCGM double (a fraction always is): DCGM 4.7's ratio, as named
    if field in CLOCKS_MHZ and scaled > HZ_ABOVE:
        return Decision((mul, div * 10**6), f"{name} reads {top:g}: Hz, read as MHz")
    if field in CLOCKS_MHZ and read.unit == "Hz" and 0 < top <= HZ_ABOVE:
        return Decision(SAME, f"{name} reads {top:g}: MHz under a hertz name, read as MHz")
    if field in FRAMEBUFFER_MIB and scaled > BYTES_ABOVE:
        return Decision((mul, div * MIB), f"{name} reads {top:g}: bytes, read as MiB")
    if field in FRAMEBUFFER_MIB and read.unit == "B" and 0 < top < MIB:
        return Decision(SAME, f"{name} reads up to {top:g}: MiB under a bytes name, read as MiB")
    return Decision(guess)
