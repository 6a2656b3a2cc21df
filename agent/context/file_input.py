"""A small text file a person points the agent at (settings, web config, token, scenario), read safely.

A path in the settings can name anything: ``/dev/zero`` (an endless read), a FIFO (``open`` blocks
until someone writes, so the agent hangs before its first log line), a directory, a 10 GB file, a
file in Latin-1. Each ends here as one line naming the path and what it is, and nothing is read
that is not a regular file: the kind is checked before opening (opening some devices has effects of
its own, a watchdog's starts its timer), and again on the open descriptor, which is opened
non-blocking so that a FIFO swapped in between cannot block the open either.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_FILE_BYTES = 2**20
"""Settings, a web config, a token or a scenario are a few kilobytes; past a MiB a file is not one
(and it is never read whole: at most this many bytes and one more are read)."""

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


class FileInputError(ValueError):
    """A file that cannot be read as what it should be; the message is one line naming it."""


def kind_of(mode: int) -> str | None:
    """What a file that is not a regular file is (``"a FIFO"``), or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_text_file(path: str | Path, where: str, what: str, max_bytes: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of the regular file at ``path``, at most ``max_bytes``.

    ``where`` starts every error (``config file /etc/roofwatch.yaml``); ``what`` names what the file
    should be (``settings file``). :class:`FileInputError` for a missing file, anything that is not a
    regular file (named: "is a FIFO"), a file too large, unreadable or not UTF-8."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileInputError(f"{where}: not found") from None
    except OSError as exc:
        raise FileInputError(f"{where}: cannot read: {exc.strerror or exc}") from None
    except ValueError:  # a NUL byte in the path
        raise FileInputError(f"{where}: not a valid path") from None
    _refuse_other_kinds(mode, where, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise FileInputError(f"{where}: cannot read: {exc.strerror or exc}") from None
    try:
        _refuse_other_kinds(os.fstat(fd).st_mode, where, what)  # replaced between the stat and the open
        raw = _read_at_most(fd, max_bytes + 1)
    except OSError as exc:
        raise FileInputError(f"{where}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(raw) > max_bytes:
        size = f"{max_bytes // 2**20} MiB" if max_bytes >= 2**20 else f"{max_bytes} bytes"
        raise FileInputError(f"{where}: larger than {size}: not a {what}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise FileInputError(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line}); "
                             "save it as UTF-8") from None


def _refuse_other_kinds(mode: int, where: str, what: str) -> None:
    kind = kind_of(mode)
    if kind == "not a regular file":
        raise FileInputError(f"{where}: is not a regular file; a {what} must be one")
    if kind is not None:
        raise FileInputError(f"{where}: is {kind}, not a regular file; a {what} must be one")


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 65536))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
