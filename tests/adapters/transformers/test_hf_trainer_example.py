"""examples/transformers_quickstart.py, run as a user would: preempted by SIGTERM, the same
command again, it ends with the weights of an uninterrupted run; once more, it says the
run is finished."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from support import lightning_procs as procs

from trainer_resume.difference import first_difference

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[3] / "examples" / "transformers_quickstart.py"


def _run(run_dir: Path, log: Path, *flags: str) -> str:
    done = procs.run([sys.executable, str(SCRIPT), str(run_dir), *flags], log)
    assert done.returncode == 0, procs.describe_failure(done, log)
    return done.stdout


def test_quickstart_preempted_and_run_again_ends_with_the_uninterrupted_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    assert "paused after step 3;" in _run(run_dir, tmp_path / "1.txt", "--preempt-at-step", "3")
    assert (run_dir / "pause.ckpt").is_file() and not (run_dir / "final_weights.pt").exists()
    assert "finished 12 steps" in _run(run_dir, tmp_path / "2.txt", "--preempt-at-step", "3")
    assert not (run_dir / "pause.ckpt").exists()

    # The uninterrupted run, and the finished run's command once more, in this process.
    spec = importlib.util.spec_from_file_location("transformers_quickstart", SCRIPT)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the runs above (OMP_NUM_THREADS=1): the same sums
    try:
        example.main([str(tmp_path / "uninterrupted")])
    finally:
        torch.set_num_threads(threads)
    example.main([str(run_dir)])
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"the run in {run_dir} is finished; weights in final_weights.pt"
    )
    expected = torch.load(tmp_path / "uninterrupted" / "final_weights.pt", weights_only=True)
    actual = torch.load(run_dir / "final_weights.pt", weights_only=True)
    difference = first_difference(expected, actual)
    assert difference is None, difference and difference.describe()
