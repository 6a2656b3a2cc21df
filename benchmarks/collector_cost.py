"""What the agent costs a GPU node while it collects, side by side with nvitop-exporter.

Both exporters run as real processes over the same fake libnvidia-ml playing the same 8-GPU
virtual node (``benchmarks.launch``), so the real NVML code path of each runs. CPU is the
process's own (psutil) over a window in steady state, minus the CPU spent inside the fake
driver, which the launcher times per call: on a real node that work is the driver's C code.
Both the gross and the net figure are reported.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import psutil

from benchmarks.figures import Figure

GPUS = 8
MIB = 2**20


@dataclass(frozen=True)
class Measurement:
    label: str
    interval_s: float
    wall_s: float
    cpu_s: float
    driver_cpu_s: float
    driver_calls: int
    rss_bytes: int
    threads: int
    exposition_bytes: int
    series: int

    @property
    def intervals(self) -> float:
        return self.wall_s / self.interval_s

    def ms_per_interval(self, *, net: bool) -> float:
        cpu = self.cpu_s - (self.driver_cpu_s if net else 0.0)
        return cpu / self.intervals * 1000.0

    def core_percent(self, *, net: bool) -> float:
        cpu = self.cpu_s - (self.driver_cpu_s if net else 0.0)
        return cpu / self.wall_s * 100.0

    @property
    def calls_per_gpu_interval(self) -> float:
        return self.driver_calls / GPUS / self.intervals


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read()
    except OSError:
        return None


def _probe(proc: subprocess.Popen[bytes], path: Path, seq: int, timeout: float = 10.0) -> dict[str, float]:
    """Ask the child for its fake-driver totals and wait for answer number ``seq``."""
    proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            data = json.loads(path.read_text())
            if data["seq"] == seq:
                return data
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.01)
    raise RuntimeError(f"{path.name}: no probe answer {seq} within {timeout}s")


@contextlib.contextmanager
def launched(label: str, which: str, args: list[str], url: str, *, env: dict[str, str] | None = None,
             prefix: str = "roofwatch-bench-") -> Iterator[tuple[subprocess.Popen[bytes], psutil.Process, Path]]:
    """One exporter started under :mod:`benchmarks.launch` (which answers probes of its driver CPU),
    once it serves ``url``: (process, its psutil handle, the probe file). Stopped on the way out."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        probe = Path(tmp) / "probe.json"
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.launch", str(probe), which, *args],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env if env is not None else {**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            deadline = time.monotonic() + 60
            while _get(url) is None:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{label} did not start serving {url}")
                time.sleep(0.1)
            yield proc, psutil.Process(proc.pid), probe
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def measure(label: str, which: str, args: list[str], url: str, *, interval_s: float, warmup_s: float,
            window_s: float) -> Measurement:
    """Start one exporter, wait for it to serve, let it settle, then measure one window."""
    with launched(label, which, args, url) as (proc, ps, probe):
        time.sleep(warmup_s)  # steady state: first reads, spec probes, classifier priming are done
        first = _probe(proc, probe, 1)
        cpu0, t0 = sum(ps.cpu_times()[:2]), time.monotonic()
        time.sleep(window_s)
        cpu1, t1 = sum(ps.cpu_times()[:2]), time.monotonic()
        last = _probe(proc, probe, 2)
        rss, threads = ps.memory_info().rss, ps.num_threads()
        body = _get(url) or b""
    series = sum(1 for line in body.decode(errors="replace").splitlines() if line and not line.startswith("#"))
    return Measurement(label, interval_s, t1 - t0, cpu1 - cpu0, last["driver_cpu_s"] - first["driver_cpu_s"],
                       int(last["calls"] - first["calls"]), rss, threads, len(body), series)


def roofwatch(interval_s: float, warmup_s: float, window_s: float) -> Measurement:
    port = _free_port()
    args = ["demo", "--backend", "nvml-virtual", "--listen", f"127.0.0.1:{port}", "--interval", str(interval_s)]
    return measure(f"roofwatch @{interval_s:g}s", "roofwatch", args, f"http://127.0.0.1:{port}/metrics",
                   interval_s=interval_s, warmup_s=warmup_s, window_s=window_s)


def nvitop(interval_s: float, warmup_s: float, window_s: float) -> Measurement:
    port = _free_port()
    args = ["--bind-address", "127.0.0.1", "--port", str(port), "--interval", str(interval_s)]
    return measure(f"nvitop-exporter @{interval_s:g}s", "nvitop", args, f"http://127.0.0.1:{port}/metrics",
                   interval_s=interval_s, warmup_s=warmup_s, window_s=window_s)


def run(quick: bool = False) -> tuple[list[Figure], list[Measurement]]:
    warmup, window = (5.0, 15.0) if quick else (10.0, 40.0)
    ours, peer = roofwatch(1.0, warmup, window), nvitop(1.0, warmup, window)
    fast = roofwatch(0.1, warmup, window / 2)
    g = "collect @1 s"
    figures = [
        Figure(g, "agent CPU per interval (net of the fake driver)", ours.ms_per_interval(net=True), "ms", 5.0,
               peer.ms_per_interval(net=True), "nvitop-exporter"),
        Figure(g, "agent CPU, % of one core (net)", ours.core_percent(net=True), "%", 0.5,
               peer.core_percent(net=True), "nvitop-exporter"),
        Figure(g, "process CPU per interval (gross, fake driver included)", ours.ms_per_interval(net=False), "ms", None,
               peer.ms_per_interval(net=False), "nvitop-exporter"),
        Figure(g, "RSS in steady state", ours.rss_bytes / MIB, "MiB", 60.0, peer.rss_bytes / MIB, "nvitop-exporter"),
        Figure(g, "NVML calls per GPU per interval", ours.calls_per_gpu_interval, "calls", None,
               peer.calls_per_gpu_interval, "nvitop-exporter"),
        Figure(g, "threads", ours.threads, "threads", None, peer.threads, "nvitop-exporter"),
        Figure(g, "series exported", ours.series, "series", None, peer.series, "nvitop-exporter"),
        Figure("collect @0.1 s", "agent CPU, % of one core (net)", fast.core_percent(net=True), "%", 5.0,
               ours.core_percent(net=True), "roofwatch @1 s"),
        Figure("collect @0.1 s", "process CPU, % of one core (gross)", fast.core_percent(net=False), "%", None),
        Figure("collect @0.1 s", "RSS", fast.rss_bytes / MIB, "MiB", 60.0, ours.rss_bytes / MIB, "roofwatch @1 s"),
    ]
    return figures, [ours, peer, fast]


def side_by_side(measurements: list[Measurement]) -> str:
    """The per-exporter table of docs/performance.md."""
    lines = ["| exporter | interval | CPU / interval, net | CPU / interval, gross | % core, net | RSS | threads | NVML calls / GPU / interval | series | exposition |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for m in measurements:
        lines.append(f"| {m.label.split(' @')[0]} | {m.interval_s:g} s | {m.ms_per_interval(net=True):.2f} ms | "
                     f"{m.ms_per_interval(net=False):.2f} ms | {m.core_percent(net=True):.2f}% | {m.rss_bytes / MIB:.1f} MiB | "
                     f"{m.threads} | {m.calls_per_gpu_interval:.1f} | {m.series} | {m.exposition_bytes / 1024:.0f} KiB |")
    return "\n".join(lines)


if __name__ == "__main__":
    from benchmarks.figures import table

    figs, runs = run(quick="--quick" in sys.argv)
    print(table(figs))
    print()
    print(side_by_side(runs))
