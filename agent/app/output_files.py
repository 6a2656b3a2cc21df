"""Writing a whole file a person asked for (``report --out``): all of it or nothing, and only where asked.

The old way wrote ``.<name>.partial`` and renamed it. That name was predictable: anyone who can
create files in the directory (``/tmp``) could plant a symbolic link there, and the write followed
it to wherever the user may write. The rename also replaced anything at the target, device nodes
included (``--out /dev/full`` as root turned the device into a file). Here the temporary file is
made by :func:`tempfile.mkstemp` (a random name, opened with ``O_EXCL``: never an existing path),
and a target that exists and is not a regular file is refused, not replaced.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path


class OutputRefused(ValueError):
    """The target exists and is not a regular file; the message names it and says what it is."""


_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def check_target(path: Path) -> None:
    """Raise :class:`OutputRefused` when ``path`` exists and is anything but a regular file.

    A symbolic link is refused too, not followed: write to the file it points at by naming it."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISREG(mode):
        return
    what = next((name for test, name in _KINDS if test(mode)), "not a file")
    raise OutputRefused(f"{path} is {what}, not a regular file: refusing to replace it")


def _umask() -> int:
    """The process's umask without changing it (reading it with os.umask sets it for a moment)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_whole(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never half.

    Raises :class:`OutputRefused` for a target that is not a regular file, ``OSError`` when the
    directory cannot be written; no temporary file is left behind either way. The new file gets
    the permissions a plain write would (0666 less the umask), not mkstemp's 0600."""
    target = Path(path)
    check_target(target)
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), 0o666 & ~_umask())
        check_target(target)  # again, just before the rename: the smallest window for a swap
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
