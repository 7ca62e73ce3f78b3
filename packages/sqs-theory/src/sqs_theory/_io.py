"""Output files: check that a location can be written *before* computing, then write atomically.

``check_output_file`` / ``check_output_dir`` raise ``ValueError`` naming the argument and the path, so a
study that takes minutes fails at once on a bad ``--out`` instead of after its compute. They create nothing.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["check_output_dir", "check_output_file", "write_text_atomic"]


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_creatable_dir(directory: Path, name: str, shown: Path) -> None:
    """``directory`` is a writable directory, or can be created under a writable one."""
    base = _nearest_existing(directory)
    if not base.is_dir():
        raise ValueError(f"{name} {shown}: {base} is not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ValueError(f"{name} {shown}: directory {base} is not writable")


def check_output_file(path: Path | str, *, name: str = "path") -> Path:
    """``path`` as a ``Path`` if a file can be written there (it may exist; it must not be a directory)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{name} {path} is a directory, not a file")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{name} {path} is not writable")
    _check_creatable_dir(path.parent, name, path)
    return path


def check_output_dir(path: Path | str, *, name: str = "out_dir", files: tuple[str, ...] = ()) -> Path:
    """``path`` as a ``Path`` if it is (or can be created as) a writable directory whose ``files`` can be written."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{name} {path} exists and is not a directory")
    _check_creatable_dir(path, name, path)
    for file in files:
        check_output_file(path / file, name=name)
    return path


def write_text_atomic(path: Path | str, text: str | bytes) -> Path:
    """Write ``text`` (UTF-8; or ``bytes`` as they are) to a temporary file beside ``path``, then ``os.replace``
    it (readers never see half a file). A symlink is followed: its target is rewritten and the link kept.

    The temporary file is created with mode 0o666 less the umask, like ``Path.write_text``. sqs-core's
    ``sqs_core.files.write_atomic`` does the same for the other packages; it is not used here because
    importing sqs-core imports torch, and ``import sqs_theory`` (the checks) needs numpy, scipy and sympy only.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    target = Path(os.path.realpath(path))  # returned as given: the user's path, link or not
    data = text.encode("utf-8") if isinstance(text, str) else text  # before the temporary file exists
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
