"""``trainer-resume demo``: an exact resume against the usual weights-only resume.

Four training subprocesses (see ``worker``): an uninterrupted reference, a
run that receives a real SIGTERM after step K and pauses, an exact resume of its
pause file in a fresh process, and a weights-only resume of the same file. The
results are compared tensor by tensor.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from omegaconf import DictConfig, OmegaConf

from .._common import EXIT_CHECK_FAILED, EXIT_ERROR, EXIT_OK
from .config import DemoConfigError, load_demo_config
from .process import DemoPhaseError, PhaseResult, run_phase
from .report import Results, print_report

__all__ = ["run_demo"]

STEPS_KEY = "train.steps"
PAUSE_FRACTION = 0.4  # default K: early enough to leave most of the run to compare


@contextmanager
def _progress(
    enabled: bool, total: int, description: str, initial: int = 0
) -> Iterator[Callable[[int], None]]:
    """A tqdm bar on stderr (shown on a terminal only) fed with completed step numbers."""
    if not enabled:
        yield lambda step: None
        return
    from tqdm import tqdm

    # disable=None: no bar when stderr is not a terminal (logs, CI, pipes).
    with tqdm(
        total=total, initial=initial, desc=description, unit="step", disable=None, leave=False
    ) as bar:
        yield lambda step: bar.update(step - bar.n)


def _steps(config: DictConfig) -> int:
    steps = OmegaConf.select(config, STEPS_KEY)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 2:
        raise DemoConfigError(f"{STEPS_KEY} must be an integer of at least 2, got {steps!r}")
    return steps


def run_demo(
    *,
    config_path: str | None,
    workdir: str | None,
    overrides: list[str],
    pause_after: int | None,
    progress: bool,
    out: TextIO,
) -> int:
    """Run the four phases and print the comparison.

    Returns:
        0 when the exact resume is bit-identical to the reference, 1 when it is
        not, 3 when a training subprocess failed.

    Raises:
        DemoConfigError: unreadable config, unknown key, bad step counts.
    """
    config = load_demo_config(config_path, overrides)
    steps = _steps(config)
    pause_at = pause_after if pause_after is not None else max(1, round(steps * PAUSE_FRACTION))
    if not 1 <= pause_at < steps:
        raise DemoConfigError(
            f"--pause-after must be between 1 and {steps - 1} ({STEPS_KEY} is {steps}), got {pause_at}"
        )

    directory = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="trainer-resume-demo-"))
    directory.mkdir(parents=True, exist_ok=True)
    keep = workdir is not None
    try:
        config_file = directory / "config.yaml"
        OmegaConf.save(config, config_file, resolve=True)
        pause_file = directory / "pause.ckpt"
        pause_file.unlink(missing_ok=True)
        source = config_path or "the bundled configs/demo.yaml"
        print(
            f"trainer-resume demo: {steps} steps of the example trainer; SIGTERM after step {pause_at}",
            file=out,
        )
        print(f"  config: {source}{' with ' + ' '.join(overrides) if overrides else ''}", file=out)
        print(
            f"  workdir: {directory}{'' if keep else ' (temporary; --workdir DIR keeps the files)'}",
            file=out,
        )
        start = time.perf_counter()
        try:
            results = _run_phases(
                directory, config_file, pause_file, steps, pause_at, progress, out
            )
        except DemoPhaseError as error:
            keep = True  # the logs and files explain the failure
            print(f"error: {error}\nthe demo's files are kept in {directory}", file=sys.stderr)
            return EXIT_ERROR
        identical = print_report(results, out)
        print(f"\ndemo finished in {time.perf_counter() - start:.0f} s", file=out)
        if workdir:
            print(
                f"pause file kept: {pause_file} (see: trainer-resume inspect {pause_file})",
                file=out,
            )
        return EXIT_OK if identical else EXIT_CHECK_FAILED
    finally:
        if not keep:
            shutil.rmtree(directory, ignore_errors=True)


def _run_phases(
    directory: Path,
    config_file: Path,
    pause_file: Path,
    steps: int,
    pause_at: int,
    progress: bool,
    out: TextIO,
) -> Results:
    logs = directory / "logs"
    logs.mkdir(exist_ok=True)

    def phase(
        number: int, name: str, mode: str, *, first: int = 0, signal_at: int | None = None
    ) -> tuple[PhaseResult, Path]:
        result_file = directory / f"{mode}.result"
        arguments = [
            "--mode", mode, "--config", str(config_file), "--pause-file", str(pause_file),
            "--result", str(result_file), "--steps", str(steps),
        ]  # fmt: skip
        with _progress(progress, steps, f"{number}/4 {name}", initial=first) as on_step:
            result = run_phase(
                arguments, log=logs / f"{mode}.log", on_step=on_step, sigterm_after=signal_at
            )
        return result, result_file

    reference, reference_file = phase(1, "reference", "reference")
    print(
        f"  1/4 reference      steps 1-{steps} uninterrupted, {reference.seconds:.1f} s", file=out
    )

    paused, paused_file = phase(2, "paused", "pause", signal_at=pause_at)
    if paused.paused_at is None or not pause_file.exists():
        raise DemoPhaseError(
            f"the paused run finished all {steps} steps before its SIGTERM took effect; "
            f"use a smaller --pause-after (now {pause_at})"
        )
    k = paused.paused_at
    print(
        f"  2/4 paused         SIGTERM sent after step {paused.signal_after}, paused at step {k}: "
        f"pause file {pause_file.stat().st_size:,} B, exit status 0, {paused.seconds:.1f} s",
        file=out,
    )

    resumed, resumed_file = phase(3, "exact resume", "resume", first=k)
    print(
        f"  3/4 exact resume   steps {k + 1}-{steps} in a fresh process, {resumed.seconds:.1f} s",
        file=out,
    )

    weights, weights_file = phase(4, "weights-only", "weights-only", first=k)
    print(
        f"  4/4 weights-only   steps {k + 1}-{steps} in a fresh process, {weights.seconds:.1f} s",
        file=out,
    )

    return Results.load(
        reference=reference_file,
        paused=paused_file,
        resumed=resumed_file,
        weights_only=weights_file,
        pause_step=k,
    )
