"""Atomic file writes: the one writer of sqs-core's artifacts and of sqs-theory's and sqs-bench's outputs.

A reader sees the old file or the complete new one, never half of it; nothing is left behind on error
(a stopped run included). A symlink is followed: its target is rewritten and the link kept. An existing
file keeps its mode bits; a new one gets 0o666 less the umask, as ``Path.write_text`` gives it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import stat
from collections.abc import Sequence
from pathlib import Path

__all__ = ["replaced_file", "write_atomic"]


def replaced_file(where: str | os.PathLike[str]) -> tuple[Path, int | None]:
    """The file that writing to the user's path ``where`` replaces, symlinks followed to their final target,
    and the mode bits it keeps (None: a new file). Refuses an existing folder (IsADirectoryError), and a
    FIFO, socket or device (ValueError), leaving it untouched. A path ending in a separator names a folder, as
    for ``open``: refused too (realpath drops the separator: "out/" wrote a file "out", "keep.txt/" replaced it)."""
    real = Path(os.path.realpath(where))
    text = os.fspath(where)
    if text.endswith(os.sep) or (os.altsep is not None and text.endswith(os.altsep)):
        if real.exists() and not real.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "ends with a separator but is a file, not a folder", text)
        raise IsADirectoryError(errno.EISDIR, "ends with a separator: names a folder, not a file", text)
    try:
        # the user's path, the kernel following its links: /dev/stdout into a pipe resolves (realpath) to
        # /proc/<pid>/fd/pipe:[..], a name that does not exist, which realpath cannot tell from a new file
        info = os.stat(where)
    except FileNotFoundError:
        return real, None
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a file", str(where))
    if not stat.S_ISREG(info.st_mode):
        via = f" (a link to {str(real)!r})" if os.path.abspath(where) != str(real) else ""
        raise ValueError(f"{str(where)!r}{via} is not a regular file (a FIFO, socket or device): not replacing it")
    return real, stat.S_IMODE(info.st_mode)


def write_atomic(where: str | os.PathLike[str], data: str | bytes | Sequence[bytes | ctypes.Array]) -> None:
    """Write ``data`` (text as UTF-8, bytes, or a sequence of byte chunks written in order) to a temporary
    file beside the file ``where`` names (:func:`replaced_file`), fsync, then rename it over that file. A
    rename replaces the directory entry: hence writing beside the symlink's target, not the symlink, and
    giving the temporary file the old file's mode first. OSErrors name ``where``, not the temporary file."""
    chunks = [data.encode("utf-8")] if isinstance(data, str) else [data] if isinstance(data, bytes) else data
    path, mode = replaced_file(where)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:  # name the user's path, not the hidden temporary file
        raise type(exc)(exc.errno, exc.strerror, str(where)) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
            handle.flush()
            if mode is not None:
                os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
