"""The unix socket jobs on this node report to, served by the agent's hardened listener.

A socket rather than TCP because the kernel tells us who connected (SO_PEERCRED), which ties a
report to its GPU process without trusting anything the client says, and because file permissions
are the access control. Any local user the mode lets in may connect, so the socket gets the same
defences as the agent's port (exporters.http.listener and exporters.http.connection): one event loop,
a deadline per state (the whole request head within ``header_timeout_s`` from connecting, the body
within ``body_timeout_s``), caps on connections per process and in all, with the oldest connection
that never sent a whole request closed to make room, and a fixed pool of workers. Until issue 32 it
was served by ``http.server`` with a 30 s timeout per read and 64 threads: 70 connections sending a
header byte every 10 s held every slot, and every honest report got 503 for as long as they stayed.

Only ``POST /api/v1/report`` is answered (404 for another path, 405 for another method).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
import threading
from pathlib import Path

from agent import __version__
from agent.context.workload.report_store import ReportStore
from exporters.http.limits import ListenerLimits
from exporters.http.listener import BACKLOG, Listener
from exporters.web_config import WebConfig

log = logging.getLogger("roofwatch.reports")

SOCKET_LIMITS = ListenerLimits(idle_timeout_s=30.0, max_connections=256, max_connections_per_client=16,
                               max_in_flight=16, workers=2)
"""A job's reporter keeps one connection; a process may hold 16 at once (a client is a PID here), the
socket 256 in all. Reports are small and answered from memory, so two workers are plenty."""


class ReportSocketServer:
    """``POST /api/v1/report`` on a unix socket at ``path``, created with file mode ``mode``."""

    reports_only = True
    server_version = f"roofwatch/{__version__}"

    def __init__(self, path: str | os.PathLike[str], store: ReportStore, *, mode: int = 0o666,
                 max_connections: int | None = None, limits: ListenerLimits | None = None) -> None:
        self.path = Path(path)
        self.reports = store
        self.store = store
        limits = limits or SOCKET_LIMITS
        if max_connections is not None:
            limits = ListenerLimits(**{**vars(limits), "max_connections": max_connections,
                                       "max_connections_per_client": min(max_connections,
                                                                         limits.max_connections_per_client)})
        self.limits = limits
        self.web = WebConfig.none()  # the file mode is the access control; answers carry no extra headers
        self.slots = threading.BoundedSemaphore(limits.max_in_flight)
        self.draining = threading.Event()
        self._thread: threading.Thread | None = None
        _prepare_socket_path(self.path)
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.socket.bind(str(self.path))
            os.chmod(self.path, mode)
            self._inode: int | None = os.stat(self.path).st_ino
            self.socket.listen(BACKLOG)
            self.socket.setblocking(False)
        except OSError:
            self.socket.close()
            raise
        self._listener = Listener(self, self.socket, limits)

    def handle_error(self, request: object, client_address: object) -> None:
        log.error("report failed", exc_info=True)

    @property
    def open_connections(self) -> int:
        return self._listener.open_connections

    def start(self) -> None:
        """Serve in a daemon thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._listener.serve_forever, name="roofwatch-reports",
                                            daemon=True)
            self._thread.start()
            log.info("workload reports on unix socket %s", self.path)

    def close(self) -> None:
        """Stop serving and remove the socket file (only if it is still ours). Idempotent."""
        if self._thread is not None:
            self._listener.shutdown()
            self._listener.close()
            self._thread.join(5.0)
            self._thread = None
        else:
            self._listener.close()
        if self._inode is not None:
            try:
                if os.stat(self.path).st_ino == self._inode:
                    os.unlink(self.path)
            except OSError:
                pass
            self._inode = None


def _prepare_socket_path(path: Path) -> None:
    """Create the directory; remove a socket left by a dead agent; refuse to touch anything else."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(errno.EEXIST, f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        log.info("removing stale report socket %s", path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    except OSError as exc:
        raise OSError(errno.EADDRINUSE, f"{path} exists and cannot be probed ({exc}); is another agent running?") from None
    finally:
        probe.close()
    raise OSError(errno.EADDRINUSE, f"another process is listening on {path}")
