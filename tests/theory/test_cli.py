"""The command line: `python -m sqs_theory checks` and `python -m sqs_theory errata`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sqs_theory.__main__ import main


def test_checks_prints_a_verdict_table(capsys, tmp_path):
    assert main(["checks", "--n-random", "2", "--json", str(tmp_path / "v.json")]) == 0
    out = capsys.readouterr().out
    for name in ("lemma-mix", "dominant-component", "gaussian-abs-mgf", "lambda-condition(delta=1.5)"):
        assert name in out
    verdicts = json.loads((tmp_path / "v.json").read_text())
    by_name = {v["name"]: v for v in verdicts}
    assert by_name["lemma-mix"]["holds"] and not by_name["dominant-component"]["holds"]


def test_errata_writes_the_file(capsys, tmp_path):
    out = tmp_path / "errata.json"
    assert main(["errata", "--out", str(out)]) == 0
    assert out.exists() and str(out) in capsys.readouterr().out


def test_unknown_command_fails():
    with pytest.raises(SystemExit):
        main(["convergencex"])


def test_module_entry_point_runs():
    result = subprocess.run([sys.executable, "-m", "sqs_theory", "--help"], capture_output=True, text=True, check=True)
    assert "errata" in result.stdout and "checks" in result.stdout


def test_outputs_are_written_whole_through_a_symlink_and_into_a_new_folder(tmp_path):
    """sqs-theory's atomic writer (its own: sqs-core's would import torch): the folder is made, a symlink's
    target is rewritten (the link stays, and is the path returned), and no temporary file is left beside it."""
    from sqs_theory._io import write_text_atomic

    assert write_text_atomic(tmp_path / "new" / "a.json", "{}") == tmp_path / "new" / "a.json"
    assert (tmp_path / "new" / "a.json").read_text() == "{}"
    (tmp_path / "target.json").write_text("old")
    (tmp_path / "link.json").symlink_to(tmp_path / "target.json")
    assert write_text_atomic(tmp_path / "link.json", b"[1]") == tmp_path / "link.json"
    assert (tmp_path / "link.json").is_symlink() and (tmp_path / "target.json").read_bytes() == b"[1]"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "new", "target.json"]


def test_the_checks_import_without_torch():
    """``import sqs_theory`` and its checks, errata and CLI helpers stay light: numpy, scipy and sympy, no torch
    (sqs-core imports torch; only the convergence study needs it)."""
    code = (
        "import sys, sqs_theory, sqs_theory.errata, sqs_theory._io, sqs_theory.checks; sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
