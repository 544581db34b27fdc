"""The package as an earlier commit had it, for files that the current code must resume.

A file written by an earlier layout of the package is only a fair test where the
arithmetic that wrote it is this machine's: a continuation computed on another CPU may
round differently (see the README's "Not bit-identical"). So such files are written
here, at test time, by the earlier commit's package, extracted from the repository with
``git archive`` and imported ahead of the installed one through ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def extract(commit: str, destination: Path) -> Path:
    """``trainer_resume`` as ``commit`` had it, under ``destination`` (returned)."""
    try:
        subprocess.run(
            ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError) as error:
        raise RuntimeError(
            f"the files of an earlier release are written by commit {commit}, which this "
            f"checkout does not have: run the tests in a clone with its history"
        ) from error
    destination.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit, "trainer_resume"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(destination)], input=archive, check=True)
    return destination


def run_script(package_root: Path, script: Path, *args: str, timeout: float = 600.0) -> str:
    """Run ``script`` with the package under ``package_root``; its output, once it passed.

    Raises:
        AssertionError: the script failed or imported another ``trainer_resume``.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package_root), str(ROOT / "tests")])}
    done = subprocess.run(
        [sys.executable, str(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{script.name} failed:\n{done.stdout}\n{done.stderr}"
    expected = str(package_root / "trainer_resume")
    assert expected in done.stdout, f"{script.name} did not import {expected}:\n{done.stdout}"
    return done.stdout
