"""Output files: check that a location can be written *before* computing, then write atomically.

``check_output_file`` / ``check_output_dir`` raise ``ValueError`` naming the argument and the path, so a
study that takes minutes fails at once on a bad ``--out`` instead of after its compute. They create nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqs_core import files

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
    """Write ``text`` (UTF-8; or ``bytes`` as they are) whole or not at all at ``path``, its folder made if
    missing, by sqs-core's writer (:func:`sqs_core.files.write_atomic`: a temporary file beside it, fsync,
    rename; a new file gets 0o666 less the umask, like ``Path.write_text``). Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_atomic(path, text)
    return path
