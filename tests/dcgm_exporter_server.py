"""A stand-in dcgm-exporter for tests: serves a fixture exposition over real HTTP from a thread.

The body can be swapped while it runs (values change, an exporter restarts with other GPUs), and
the server can be stopped and started again on the same port (the exporter goes down and comes
back), as a node's exporter would. Only the HTTP side is simulated; the bodies are the fixtures
under tests/fixtures/dcgm_exporter/, in the real exporter's format.
"""

from __future__ import annotations

import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "dcgm_exporter"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def set_value(body: str, metric: str, gpu: str, value: str) -> str:
    """``body`` with ``metric``'s value for GPU key ``gpu`` (``"3"`` or ``"3/7"``) replaced."""
    index, _, instance = gpu.partition("/")
    tail = rf'[^}}\n]*GPU_I_ID="{instance}"' if instance else r'(?![^}\n]*GPU_I_ID)'
    pattern = re.compile(rf'^({re.escape(metric)}\{{gpu="{index}",{tail}[^}}\n]*\}}) \S+$', re.MULTILINE)
    new, count = pattern.subn(lambda m: f"{m.group(1)} {value}", body)
    assert count == 1, f"{metric} for GPU {gpu}: {count} lines"
    return new


def drop_gpu(body: str, gpu: str) -> str:
    """``body`` without any series of whole GPU ``gpu`` (an exporter restarted without it)."""
    return "\n".join(line for line in body.splitlines() if f'{{gpu="{gpu}",' not in line) + "\n"


def replace_uuids(body: str, uuids: dict[str, str]) -> str:
    """GPU index -> UUID: the fixture's UUIDs swapped for another node's (the fake NVML's). The label is
    ``UUID``, or ``uuid`` with ``--use-old-namespace``; exporter 2.1.4 writes a space after the comma
    (``{gpu="0", UUID="..."}``); both are kept as they are."""
    def swap(match: re.Match[str]) -> str:
        gpu, gap, label, old = match.groups()
        return f'{{gpu="{gpu}",{gap}{label}="{uuids.get(gpu, old)}"'
    return re.sub(r'\{gpu="(\d+)",(\s*)(UUID|uuid)="([^"]+)"', swap, body)


MANY_GPU_FIELDS = ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
                   "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_FB_USED")


def many_gpus(count: int, fields: tuple[str, ...] = MANY_GPU_FIELDS) -> str:
    """An exposition listing ``count`` GPUs, each GPU 7 of the A100 fixture (its lines for ``fields``)
    with its own index and UUID, field by field as dcgm-exporter prints: a hostile or misdirected
    exporter. 10,000 GPUs are about 11 MiB, inside the reader's 16 MiB body cap and 100,000 series."""
    template = [line.split('{gpu="7",', 1) for line in fixture("a100-8x-pods.prom").splitlines()
                if line.startswith(tuple(f'{name}{{gpu="7",' for name in fields))]
    assert len(template) == len(fields), "every field of GPU 7 is in the fixture"
    uuid = re.search(r'UUID="(GPU-[0-9a-f-]+)"', template[0][1]).group(1)
    lines = [f'{head}{{gpu="{i}",{tail.replace(uuid, f"{uuid[:-12]}{i:012x}")}'
             for head, tail in template for i in range(count)]
    return "\n".join(lines) + "\n"


def lengthen_labels(body: str, length: int, names: tuple[str, ...] = ("Hostname", "UUID", "modelName")) -> str:
    """``body`` with each label in ``names`` grown to ``length`` characters (its own value repeated, so
    UUIDs stay distinct per GPU): a hostile exporter's labels."""
    def grow(match: re.Match[str]) -> str:
        value = (match.group(2) + "~") * (length // (len(match.group(2)) + 1) + 1)
        return f'{match.group(1)}="{value[:length]}"'
    return re.sub(rf'\b({"|".join(names)})="([^"]*)"', grow, body)


class FakeExporter:
    """``/metrics`` answering with :attr:`body`; :meth:`stop` and :meth:`start` keep the port."""

    def __init__(self, body: str, port: int = 0) -> None:
        self.body = body
        self.requests = 0
        self.answered_at: float | None = None
        """Wall-clock time of the first ``/metrics`` answer since the last :meth:`start`: when the exporter
        arrived, as an agent could first see it."""
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.port = port
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def set_body(self, body: str) -> None:
        with self._lock:
            self.body = body

    def start(self) -> None:
        owner = self
        self.answered_at = None

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                with owner._lock:
                    owner.requests += 1
                    data = owner.body.encode()
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                with owner._lock:
                    owner.answered_at = owner.answered_at or time.time()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "FakeExporter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
