"""Importing sqs_core is cheap and side-effect free: only torch, safetensors and the standard library."""

import json
import subprocess
import sys

SCRIPT = """
import sys, json, torch
before = set(sys.modules)
import sqs_core
added = sorted(m.split('.')[0] for m in set(sys.modules) - before)
print(json.dumps({"added": sorted(set(added)), "threads": torch.get_num_threads(),
                  "grad": torch.is_grad_enabled(), "dtype": str(torch.get_default_dtype())}))
"""


def test_import_adds_only_sqs_core_and_allowed_dependencies():
    before = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        capture_output=True,
        text=True,
        check=True,
    )
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    allowed = {"sqs_core", "safetensors"} | set(sys.stdlib_module_names)
    assert set(result["added"]) <= allowed, result["added"]
    assert out.stderr == before.stderr  # whatever torch itself prints (e.g. no numpy), nothing more
    assert result["threads"] == int(before.stdout)
    assert result["grad"] is True and result["dtype"] == "torch.float32"
