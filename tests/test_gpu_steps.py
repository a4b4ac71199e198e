"""``scripts/gpu-steps``: GPU steps run in order within a deadline, logged to one file.

Runs on the CPU with stand-ins on ``PATH`` for ``nvidia-smi`` and for ``python3``'s CUDA probe
(the script's steps here are plain shell commands)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-steps"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _stand_ins(bin_dir: Path, cuda_up: bool) -> dict[str, str]:
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'Stand-in GPU, 0.0'\n")
    probe = "echo 'torch stand-in'; exit 0" if cuda_up else "exit 1"
    py = bin_dir / "python3"
    py.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then {probe}; fi\nexec {sys.executable} "$@"\n')
    for f in (smi, py):
        f.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def _run(tmp_path: Path, steps: str, deadline: int, cuda_up: bool = True):
    env = _stand_ins(tmp_path / "bin", cuda_up)
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(SCRIPT), str(deadline), str(out)],
        input=steps,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    log = out / "all.log"
    return done, log.read_text() if log.exists() else ""


def test_steps_run_in_order_with_their_exit_codes_and_one_log(tmp_path):
    steps = "# a comment\n\nok 10 echo hello\nfails 10 exit 7\nslow 1 sleep 5\n"
    done, log = _run(tmp_path, steps, 100)
    assert done.returncode == 0, done.stderr
    lines = [line.split(" rc=") for line in done.stdout.splitlines() if " rc=" in line]
    assert [(name, rc.split()[0]) for name, rc in lines] == [
        ("ok", "0"),
        ("fails", "7"),
        ("slow", "124"),  # stopped at its own limit
    ]
    assert "=== ok (10 s): echo hello\nhello\n--- ok rc=0" in log


def test_steps_past_the_deadline_are_skipped(tmp_path):
    done, log = _run(tmp_path, "first 10 echo one\n", 10)
    assert "SKIP first (no time left)" in done.stdout
    assert "one" not in log


def test_a_gpu_that_does_not_come_up_stops_the_run(tmp_path):
    done, log = _run(tmp_path, "never 10 echo ran\n", 100, cuda_up=False)
    assert done.returncode == 3
    assert "did not come up" in done.stdout and log == ""


def test_bad_numbers_are_one_line_each(tmp_path):
    done, log = _run(tmp_path, "typo 1O echo never\nok 10 echo fine\n", 100)
    assert "SKIP typo (TIMEOUT_S '1O' is not a whole number of seconds)" in done.stdout
    assert "fine" in log and "never" not in log
    env = _stand_ins(tmp_path / "bin2", True)
    bad = subprocess.run(
        ["bash", str(SCRIPT), "ten"], input="", capture_output=True, text=True, env=env, timeout=60
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines() == [
        "gpu-steps: DEADLINE_S must be a whole number of seconds, not 'ten' (usage: gpu-steps "
        "DEADLINE_S [OUTDIR] < STEPS)"
    ]
