"""Where the CLI and the study write: FIFOs, devices, symlinks, trailing separators, the probe of a folder, the
order in which the study's JSON and PNG are replaced, and the inputs of ``docs`` (session 64's audit)."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest
from sqs_theory import _io, convergence
from sqs_theory.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "docs" / "results" / "theory" / "convergence.json"


def _fails(capsys, argv: list[str], *needles: str) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


@pytest.fixture
def char_device(tmp_path) -> Path:
    """A character device like /dev/null (1, 3), made under tmp_path (never the real one)."""
    path = tmp_path / "nulldev"
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"mknod not permitted here: {exc}")
    return path


def _kind(path: Path) -> str:
    mode = os.lstat(path).st_mode
    return "fifo" if stat.S_ISFIFO(mode) else "chr" if stat.S_ISCHR(mode) else "link" if stat.S_ISLNK(mode) else "?"


# --- F1: a FIFO, socket or device is refused, before the compute and in the writer -----------------------
@pytest.mark.parametrize("special", ["fifo", "char_device"])
def test_cli_refuses_to_replace_a_fifo_or_device(capsys, no_compute, request, special):
    path = request.getfixturevalue(special)
    kind = _kind(path)
    _fails(capsys, ["errata", "--out", str(path)], "--out", str(path), "not a regular file")
    _fails(capsys, ["checks", "--n-random", "1", "--json", str(path)], "--json", "not a regular file")
    assert _kind(path) == kind  # still the FIFO / device, not a regular file


def test_a_symlink_to_a_fifo_is_refused_and_kept(capsys, no_compute, fifo, tmp_path):
    link = tmp_path / "out.json"
    link.symlink_to(fifo)
    _fails(capsys, ["errata", "--out", str(link)], str(link), "a link to", "not a regular file")
    assert _kind(link) == "link" and _kind(fifo) == "fifo"


def test_a_link_to_a_pipe_like_dev_stdout_is_refused_before_the_compute(capsys, no_compute, tmp_path):
    """/dev/stdout into a pipe: realpath gives /proc/<pid>/fd/pipe:[..], a name that does not exist; the check
    passed it as a new file and the write failed after the compute."""
    read_end, write_end = os.pipe()
    try:
        link = tmp_path / "stdout"
        link.symlink_to(f"/proc/self/fd/{write_end}")
        if not stat.S_ISFIFO(os.stat(link).st_mode):
            pytest.skip("/proc/self/fd does not show the pipe here")
        _fails(capsys, ["checks", "--n-random", "1", "--json", str(link)], "--json", "not a regular file")
    finally:
        os.close(read_end)
        os.close(write_end)


def test_the_writer_refuses_a_fifo_and_a_device(fifo, char_device):
    for path in (fifo, char_device):
        with pytest.raises(ValueError, match="not a regular file"):
            _io.write_text_atomic(path, "x")
    assert _kind(fifo) == "fifo" and _kind(char_device) == "chr"
    assert sorted(p.name for p in fifo.parent.iterdir()) == ["fifo", "nulldev"]


def test_the_study_folder_check_refuses_a_fifo_in_it(fifo, tmp_path):
    os.rename(fifo, tmp_path / "convergence.json")
    with pytest.raises(ValueError, match="not a regular file"):
        _io.check_output_dir(tmp_path, files=("convergence.json", "convergence.png"))


# --- F5: a trailing separator names a folder -------------------------------------------------------------
def test_a_trailing_separator_is_refused(capsys, no_compute, tmp_path):
    report = tmp_path / "report"
    report.write_text("keep\n")
    _fails(capsys, ["errata", "--out", f"{report}{os.sep}"], "--out", "separator")
    _fails(capsys, ["checks", "--n-random", "1", "--json", f"{tmp_path / 'newdir'}{os.sep}"], "--json", "separator")
    assert report.read_text() == "keep\n" and sorted(p.name for p in tmp_path.iterdir()) == ["report"]
    with pytest.raises(ValueError, match="separator"):
        _io.write_text_atomic(f"{tmp_path / 'new'}{os.sep}", "x")
    assert not (tmp_path / "new").exists()


# --- F2: the folder is probed, symlinks resolved, and a failed figure leaves the JSON --------------------
def test_a_dangling_symlink_into_a_missing_folder_is_refused_before_the_study(capsys, no_compute, tmp_path):
    (tmp_path / "convergence.json").write_text('{"good": true}\n')
    (tmp_path / "convergence.png").symlink_to(tmp_path / "missing" / "convergence.png")
    _fails(capsys, ["convergence", "--tier", "tiny", "--out", str(tmp_path)], "convergence.png", "does not exist")
    assert (tmp_path / "convergence.json").read_text() == '{"good": true}\n'


def test_the_check_probes_the_folder_with_a_new_file(capsys, no_compute, tmp_path, monkeypatch):
    """As root os.access says yes to every folder: the check creates (and removes) a file to know."""
    real_open, locked = os.open, tmp_path / "locked"
    locked.mkdir()

    def refusing_open(path, flags, *args, **kwargs):
        if Path(path).parent == locked and flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    _fails(capsys, ["errata", "--out", str(locked / "e.json")], "--out", "cannot create a file", "Permission denied")
    _fails(capsys, ["convergence", "--tier", "tiny", "--out", str(locked)], "--out", "cannot create a file")
    monkeypatch.undo()
    assert list(locked.iterdir()) == []
    assert _io.check_output_file(tmp_path / "ok.json") == tmp_path / "ok.json" and list(tmp_path.iterdir()) == [locked]


def _fake_study(monkeypatch) -> None:
    result = json.loads(COMMITTED.read_text())
    for key in ("machine", "started_utc"):
        result.pop(key, None)
    monkeypatch.setattr(convergence, "run_study", lambda tier: result)


def test_a_figure_that_fails_leaves_the_previous_json(tmp_path, monkeypatch):
    """The figure is drawn in memory before either file is replaced (the JSON was replaced, then the PNG failed)."""
    import matplotlib.figure

    _fake_study(monkeypatch)
    (tmp_path / "convergence.json").write_text('{"good": true}\n')

    def broken_savefig(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", broken_savefig)
    with pytest.raises(OSError, match="No space left"):
        convergence.write_study("tiny", tmp_path)
    assert (tmp_path / "convergence.json").read_text() == '{"good": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["convergence.json"]


def test_a_png_that_cannot_be_written_leaves_the_previous_json(tmp_path, monkeypatch):
    _fake_study(monkeypatch)
    (tmp_path / "convergence.json").write_text('{"good": true}\n')
    real_fsync = os.fsync
    calls = []

    def fsync_fails_second(fd):  # the PNG's temporary file is written, the JSON's fails: neither replaced
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.EIO, "Input/output error")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync_fails_second)
    with pytest.raises(OSError, match="Input/output"):
        convergence.write_study("tiny", tmp_path)
    assert (tmp_path / "convergence.json").read_text() == '{"good": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["convergence.json"]
    monkeypatch.undo()
    _fake_study(monkeypatch)
    json_path, png_path = convergence.write_study("tiny", tmp_path)
    assert json.loads(json_path.read_text())["tier"] == "full" and png_path.read_bytes().startswith(b"\x89PNG")


# --- F9, F11: threads and out_dir ------------------------------------------------------------------------
def test_threads_are_capped(capsys, no_compute, tmp_path):
    _fails(capsys, ["convergence", "--tier", "tiny", "--threads", str(2**31), "--out", str(tmp_path)],
           "--threads", "[1, 1024]", str(2**31))  # fmt: skip
    with pytest.raises(ValueError, match=r"^threads must be an integer in \[1, 1024\], got 1025"):
        convergence.write_study("tiny", tmp_path, threads=1025)


@pytest.mark.parametrize("out_dir", [None, 3, b"bytes"])
def test_write_study_names_a_bad_out_dir(no_compute, out_dir):
    with pytest.raises(ValueError, match=r"^out_dir must be a"):
        convergence.write_study("tiny", out_dir)


# --- F3, F6: the docs command's convergence JSON ---------------------------------------------------------
def test_docs_check_refuses_a_missing_convergence_json(capsys, no_compute, tmp_path):
    typo = tmp_path / "typo.json"
    _fails(capsys, ["docs", "--convergence", str(typo), "--check"], "--convergence", str(typo))


def test_docs_check_fails_when_the_default_json_is_missing(capsys, no_compute, tmp_path, monkeypatch):
    doc = tmp_path / "theory.md"
    doc.write_text((ROOT / "docs" / "theory.md").read_text())
    monkeypatch.setattr("sqs_theory.__main__.COMMITTED_CONVERGENCE", tmp_path / "absent.json")
    _fails(capsys, ["docs", "--path", str(doc), "--check"], "absent.json", "cannot be checked")


def test_docs_names_the_file_and_key_of_a_wrongly_shaped_json(capsys, no_compute, tmp_path):
    errata_json = ROOT / "docs" / "results" / "theory" / "errata.json"
    _fails(capsys, ["docs", "--convergence", str(errata_json), "--check"], str(errata_json), "JSON object")
    result = json.loads(COMMITTED.read_text())
    del result["summary"][2]["median"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(result))
    _fails(capsys, ["docs", "--convergence", str(bad), "--check"], str(bad), "summary[2]", "'median'")
    del result["theory"]["parametric"]
    bad.write_text(json.dumps(result))
    _fails(capsys, ["docs", "--convergence", str(bad), "--check"], "theory.parametric")
