"""sqs_core.files: the atomic writer that the artifact, sqs-theory and sqs-bench share."""

import os
import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqs_core import files


@given(parts=st.lists(st.binary(max_size=64), max_size=5), text=st.text(max_size=64))
def test_bytes_text_and_chunks_are_written_whole(tmp_path_factory, parts, text):
    folder = tmp_path_factory.mktemp("w")
    files.write_atomic(folder / "chunks", parts)
    files.write_atomic(str(folder / "text"), text)
    files.write_atomic(folder / "bytes", b"".join(parts))
    assert (folder / "chunks").read_bytes() == b"".join(parts) == (folder / "bytes").read_bytes()
    assert (folder / "text").read_bytes() == text.encode("utf-8")
    assert sorted(p.name for p in folder.iterdir()) == ["bytes", "chunks", "text"]  # no temporary file left


def test_a_new_file_gets_the_umask_mode_and_an_old_one_keeps_its_own(tmp_path):
    old = os.umask(0o022)
    try:
        files.write_atomic(tmp_path / "new", "x")
        (tmp_path / "kept").write_text("old")
        os.chmod(tmp_path / "kept", 0o600)
        files.write_atomic(tmp_path / "kept", "new")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "kept").stat().st_mode) == 0o600
    assert (tmp_path / "kept").read_text() == "new"


def test_a_symlink_keeps_pointing_at_its_rewritten_target(tmp_path):
    (tmp_path / "target").write_text("old")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    files.write_atomic(tmp_path / "link", "new")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "target").read_text() == "new"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    (tmp_path / "f").write_text("old")

    def fail(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="No space left"):
        files.write_atomic(tmp_path / "f", "new")
    assert (tmp_path / "f").read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f"]


def test_folders_fifos_and_unwritable_places_are_refused_by_name(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory"):
        files.write_atomic(tmp_path, "x")
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ValueError, match=r"pipe.*is not a regular file"):
        files.write_atomic(tmp_path / "pipe", "x")
    with pytest.raises(FileNotFoundError) as info:
        files.write_atomic(tmp_path / "missing" / "f", "x")
    assert info.value.filename == str(tmp_path / "missing" / "f")  # the user's path, not the temporary one


def test_a_link_to_a_pipe_like_dev_stdout_is_refused(tmp_path):
    """/dev/stdout into a pipe resolves (realpath) to /proc/<pid>/fd/pipe:[..], a name that does not exist: it was
    taken for a new file there, and the write failed on the temporary file's path instead of refusing the pipe."""
    read_end, write_end = os.pipe()
    try:
        link = tmp_path / "stdout"
        link.symlink_to(f"/proc/self/fd/{write_end}")
        if not os.path.exists(link):
            pytest.skip("no /proc/self/fd on this system")
        with pytest.raises(ValueError, match="is not a regular file"):
            files.write_atomic(link, "x")
    finally:
        os.close(read_end)
        os.close(write_end)
