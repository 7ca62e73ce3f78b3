"""Output files: check that a location can be written *before* computing, then write atomically.

``check_output_file`` / ``check_output_dir`` raise ``ValueError`` naming the argument and the path, so a
study that takes minutes fails at once on a bad ``--out`` instead of after its compute. They leave nothing
behind: the folder a file will go to is probed by creating and removing a uniquely named empty file (as root,
``os.access`` says yes to every folder, a read-only mount included).

The policy is sqs-core's (``sqs_core.files.replaced_file``; not imported: it would import torch, and
``import sqs_theory`` needs numpy, scipy and sympy only): a symlink is followed to its final target, which is
what gets replaced; a FIFO, socket or device is refused, never replaced by a regular file; a path ending in a
separator names a folder and is refused as a file. The type of an existing target is read with ``os.stat`` on
the user's path, not on its ``realpath``: ``/dev/stdout`` into a pipe resolves to ``/proc/<pid>/fd/pipe:[..]``,
a name that does not exist, which ``realpath`` cannot tell from a new file.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

__all__ = ["check_output_dir", "check_output_file", "write_files_atomic", "write_text_atomic"]


def _path_text(path: object, name: str) -> str:
    """``path`` as the string the user gave (a str or an os.PathLike), or a ValueError naming ``name``."""
    if not isinstance(path, str | os.PathLike):
        raise ValueError(f"{name} must be a path (str or os.PathLike), got {path!r:.80}")
    text = os.fspath(path)
    if not isinstance(text, str) or not text:
        raise ValueError(f"{name} must be a non-empty path, got {path!r:.80}")
    return text


def _ends_with_separator(text: str) -> bool:
    return text.endswith(os.sep) or (os.altsep is not None and text.endswith(os.altsep))


def _replaced_file(path: object, name: str) -> tuple[str, Path, bool]:
    """(the user's path, the file writing there replaces with symlinks followed, whether it exists); refuses a
    trailing separator, a directory, and a FIFO, socket or device (ValueError naming ``name`` and the path)."""
    text = _path_text(path, name)
    if _ends_with_separator(text):
        raise ValueError(f"{name} {text} ends with a separator: it names a folder, not a file")
    real = Path(os.path.realpath(text))
    try:
        mode = os.stat(text).st_mode  # the kernel follows /dev/stdout -> /proc/self/fd/1 -> pipe, realpath cannot
    except FileNotFoundError:
        return text, real, False
    except OSError as exc:
        raise ValueError(f"{name} {text}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise ValueError(f"{name} {text} is a directory, not a file")
    if not stat.S_ISREG(mode):
        via = f" (a link to {str(real)!r})" if os.path.abspath(text) != str(real) else ""
        raise ValueError(f"{name} {text}{via} is not a regular file (a FIFO, socket or device): not replacing it")
    return text, real, True


def _nearest_existing(path: Path) -> Path:
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def _probe(directory: Path, name: str, shown: str) -> None:
    """Create and remove a uniquely named empty file in ``directory``: does it really accept a new file?"""
    probe = directory / f".sqs-theory-probe.{os.getpid()}.{secrets.token_hex(6)}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        raise ValueError(f"{name} {shown}: cannot create a file in {directory}: {exc.strerror or exc}") from None
    probe.unlink()


def _check_creatable_dir(directory: Path, name: str, shown: str) -> None:
    """``directory`` accepts a new file, or can be created under a folder that does (symlinks followed)."""
    base = _nearest_existing(directory)
    if not base.is_dir():
        raise ValueError(f"{name} {shown}: {base} is not a directory")
    _probe(Path(os.path.realpath(base)), name, shown)


def check_output_file(path: Path | str, *, name: str = "path") -> Path:
    """``path`` as a ``Path`` if a file can be written there: absent, or a writable regular file (through
    symlinks); not a directory, FIFO, socket or device; not ending in a separator. Its folder may be missing
    (the writer creates it), unless ``path`` is a symlink: the writer does not create its target's folder."""
    text, real, exists = _replaced_file(path, name)
    if exists and not os.access(real, os.W_OK):
        raise ValueError(f"{name} {text} is not writable")
    parent = Path(text).parent
    if not os.path.lexists(parent):  # the writer creates it (and nothing in it can be a symlink yet)
        _check_creatable_dir(parent, name, text)
        return Path(text)
    if not real.parent.is_dir():  # a symlink (to the file or to its folder) into a missing folder
        raise ValueError(f"{name} {text} resolves to {real}, whose folder {real.parent} does not exist")
    _probe(real.parent, name, text)
    return Path(text)


def check_output_dir(path: Path | str, *, name: str = "out_dir", files: tuple[str, ...] = ()) -> Path:
    """``path`` as a ``Path`` if it is (or can be created as) a writable directory whose ``files`` can be written."""
    folder = Path(_path_text(path, name))
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{name} {folder} exists and is not a directory")
    _check_creatable_dir(folder, name, str(folder))
    for file in files:
        check_output_file(folder / file, name=name)
    return folder


def write_files_atomic(contents: Mapping[Path | str, str | bytes]) -> list[Path]:
    """Write each value (text as UTF-8, or bytes) to a temporary file beside the file its key names, then
    ``os.replace`` them all, in order: a failure while writing leaves every file as it was, and no temporary
    file behind. The paths are those of :func:`write_text_atomic` (symlinks followed; FIFOs, sockets, devices,
    directories and a trailing separator refused, before anything is written). Returns the keys as ``Path``s."""
    targets = []
    for key in contents:
        text = _path_text(key, "path")
        _replaced_file(text, "path")  # the separator check before mkdir: "out/" would make a folder "out"
        Path(text).parent.mkdir(parents=True, exist_ok=True)
        targets.append((text, _replaced_file(text, "path")[1]))
    temps: list[Path] = []
    try:
        for (text, target), data in zip(targets, contents.values(), strict=True):
            temps.append(_write_temp(text, target, data))
        for (_, target), tmp in zip(targets, list(temps), strict=True):
            os.replace(tmp, target)
            temps.remove(tmp)
    finally:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
    return [Path(text) for text, _ in targets]


def _write_temp(text: str, target: Path, data: str | bytes) -> Path:
    """A new temporary file beside ``target`` holding ``data``, fsynced; OSErrors name the user's path."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:  # name the user's path, not the hidden temporary file
        raise type(exc)(exc.errno, exc.strerror, text) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def write_text_atomic(path: Path | str, text: str | bytes) -> Path:
    """Write ``text`` (UTF-8; or ``bytes`` as they are) to a temporary file beside ``path``, then ``os.replace``
    it (readers never see half a file). A symlink is followed: its target is rewritten and the link kept. A
    FIFO, socket, device or directory is refused (ValueError), as is a path ending in a separator.

    The temporary file is created with mode 0o666 less the umask, like ``Path.write_text``. sqs-core's
    ``sqs_core.files.write_atomic`` does the same for the other packages; it is not used here because
    importing sqs-core imports torch, and ``import sqs_theory`` (the checks) needs numpy, scipy and sympy only.
    """
    return write_files_atomic({path: text})[0]
