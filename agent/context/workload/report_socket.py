"""The unix socket jobs on this node report to: the kernel says who connected, the file mode who may.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import socketserver
import stat
import struct
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from agent.context.workload.report_http import REPORT_PATH, linger, respond, serve_report
from agent.context.workload.report_schema import MAX_BODY_BYTES
from agent.context.workload.report_store import ReportStore

log = logging.getLogger("roofwatch.reports")

def peer_pid(sock: socket.socket) -> int | None:
    """The connecting process's PID as the kernel knows it (translated into our PID namespace).

    0 means the peer lives in a namespace we cannot see; that is unknown, not PID 0.
    """
    try:
        data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, _uid, _gid = struct.unpack("3i", data)
    except (OSError, AttributeError, struct.error):
        return None
    return pid if pid > 0 else None


class _SocketHandler(BaseHTTPRequestHandler):
    server: "ReportSocketServer"
    protocol_version = "HTTP/1.1"
    server_version = "roofwatch-reports"
    timeout = 30.0
    """Idle keep-alive connections close after this long, so each connected job holds a thread only while it reports."""

    def setup(self) -> None:
        super().setup()
        self.peer_pid = peer_pid(self.request)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        log.debug("report socket %s", format % args)

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        if self.path.split("?", 1)[0] != REPORT_PATH:
            respond(self, HTTPStatus.NOT_FOUND, f"not found; reports go to POST {REPORT_PATH}", close=True)
            return
        # The socket is local by construction; its file mode decides who may connect.
        serve_report(self, self.server.store, peer_pid=self.peer_pid, from_loopback=True,
                     client=("pid", self.peer_pid) if self.peer_pid is not None else ("socket",))

    def _not_allowed(self) -> None:
        respond(self, HTTPStatus.METHOD_NOT_ALLOWED, f"only POST {REPORT_PATH} is supported", close=True,
                 headers={"Allow": "POST"})

    do_GET = do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed  # noqa: N815


class ReportSocketServer(socketserver.ThreadingUnixStreamServer):
    """HTTP on a unix socket, for jobs on this node (containers mount the socket's directory).

    A socket rather than TCP because the kernel tells us who connected (SO_PEERCRED), which
    ties a report to its GPU process without trusting anything the client says, and because
    file permissions are the access control. Past ``max_connections`` connections a new one
    gets 503 and is closed instead of another thread.
    """

    daemon_threads = True

    def __init__(self, path: str | os.PathLike[str], store: ReportStore, *, mode: int = 0o666,
                 max_connections: int = 64) -> None:
        self.path = Path(path)
        self.store = store
        self._slots = threading.BoundedSemaphore(max_connections)
        self._thread: threading.Thread | None = None
        _prepare_socket_path(self.path)
        super().__init__(str(self.path), _SocketHandler)
        try:
            os.chmod(self.path, mode)
            self._inode: int | None = os.stat(self.path).st_ino
        except OSError:
            self.server_close()
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                request.settimeout(0.1)
                body = b"too many concurrent report connections\n"
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
                                b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                linger(request, max_bytes=MAX_BODY_BYTES + 8192, max_s=0.1)  # on the accept thread: keep it short
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def start(self) -> None:
        """Serve in a daemon thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2},
                                            name="roofwatch-reports", daemon=True)
            self._thread.start()
            log.info("workload reports on unix socket %s", self.path)

    def close(self) -> None:
        """Stop serving and remove the socket file (only if it is still ours). Idempotent."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(5.0)
            self._thread = None
        self.server_close()
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
