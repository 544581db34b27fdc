"""Launching the Hydra apps of ``support/hydra_apps`` as a user does, and their references.

A :class:`Project` is one folder (``PROJECT_ROOT``, ``DATA_DIR`` below it) in which the
same app is launched again and again: ``python <app>.py [overrides]``, or ``-m`` for a
sweep whose jobs run one after another in one process. :meth:`Project.pause` sends the
real SIGTERM once a job has finished its step and waits for it; :func:`reference`
trains the uninterrupted run in this process, from the config Hydra composes.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from support import lightning_procs as procs
from support.hydra_apps.common import WAIT_ENV
from trainer_resume.testing import first_difference

APPS = Path(__file__).resolve().parent / "hydra_apps"
CONFIGS = APPS / "configs"
PAUSE_STEP = 3
STEPS = 6  # trainer.max_steps of configs/train.yaml


class Project:
    """The folder of one user's runs of ``app`` (``"mixin"`` or ``"lightning"``)."""

    def __init__(self, root: Path, app: str) -> None:
        self.root = root
        self.app = app
        self.env = {"PROJECT_ROOT": str(root), "DATA_DIR": str(root / "data")}
        root.mkdir(parents=True, exist_ok=True)
        self._launches = 0

    def command(self, *overrides: str) -> list[str]:
        return [sys.executable, str(APPS / f"{self.app}_app.py"), *overrides]

    def _log(self) -> Path:
        self._launches += 1
        return self.root / f"launch{self._launches}.stderr"

    def pause(self, *overrides: str, jobs: int = 1) -> list[str]:
        """Launch, SIGTERM each job after step ``PAUSE_STEP``; the stdout lines.

        Raises:
            AssertionError: the run did not exit 0 with every job paused at that step.
        """
        log = self._log()
        status, lines = procs.run_and_signal(
            self.command(*overrides),
            log,
            line=f"WAITING {PAUSE_STEP}",
            signum=procs.SIGTERM,
            env={**self.env, WAIT_ENV: str(PAUSE_STEP)},
            cwd=self.root,
            times=jobs,
        )
        paused = [line for line in lines if line.startswith("PAUSED ")]
        assert status == 0 and paused == [f"PAUSED {PAUSE_STEP}"] * jobs, procs.describe_exit(
            status, lines, log
        )
        return lines

    def launch(self, *overrides: str, env: dict[str, str] | None = None) -> Launch:
        """Launch to the end, as a requeued job runs its command again."""
        log = self._log()
        done = procs.run(
            self.command(*overrides), log, env={**self.env, **(env or {})}, cwd=self.root
        )
        return Launch(done, log)

    def pause_file(self, seed: int = 1) -> Path:
        return self.root / "pauses" / f"train-seed{seed}.ckpt"

    def result(self, seed: int) -> dict[str, Any]:
        return torch.load(self.root / "results" / f"{self.app}-seed{seed}.pt", weights_only=True)


class Launch:
    """A finished launch: exit status, stdout lines, stderr."""

    def __init__(self, done: subprocess.CompletedProcess[str], log: Path) -> None:
        self.status = done.returncode
        self.lines = done.stdout.splitlines()
        self.stderr = log.read_text(errors="replace")

    def describe(self) -> str:
        return f"exit {self.status}; stdout tail: {self.lines[-5:]}\nstderr:\n{self.stderr[-3000:]}"


def output_dirs(lines: list[str]) -> list[str]:
    """The trainer's ``default_root_dir`` (Hydra's output directory) of each job."""
    return [line.split(" ", 1)[1] for line in lines if line.startswith("OUTPUT_DIR ")]


def reference(app: str, root: Path, *overrides: str) -> dict[str, Any]:
    """The uninterrupted run, in this process, from the config Hydra composes."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    threads = torch.get_num_threads()  # the apps train on one thread; later tests must not
    try:
        return _reference(app, root, overrides)
    finally:
        torch.set_num_threads(threads)


def _reference(app: str, root: Path, overrides: tuple[str, ...]) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PROJECT_ROOT", str(root))
        patch.setenv("DATA_DIR", str(root / "data"))
        patch.delenv(WAIT_ENV, raising=False)
        with initialize_config_dir(version_base="1.3", config_dir=str(CONFIGS)):
            cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
        # Hydra's config set as a launch sets it (${hydra:runtime.choices...} resolves),
        # until the reference is done; the config without its hydra node, as the app's
        # main receives it.
        patch.setattr(HydraConfig.instance(), "cfg", HydraConfig.instance().cfg)
        HydraConfig.instance().set_config(cfg)
        cfg = copy.deepcopy(cfg)
        with open_dict(cfg):
            del cfg["hydra"]
        results = root / "results"
        if app == "mixin":
            from support.hydra_apps import mixin_app

            mixin_app.train(cfg, results)
        else:
            from support.hydra_apps import lightning_app

            lightning_app.fit(
                cfg, default_root_dir=str(root / "fit"), logger=False, results=results
            )
        return torch.load(results / f"{app}-seed{cfg.seed}.pt", weights_only=True)


def assert_continues_reference(resumed: dict[str, Any], expected: dict[str, Any]) -> None:
    """The resumed process's weights, optimizer state and losses (the steps after the
    pause) are those of the uninterrupted run, tensor by tensor."""
    after = {step: loss for step, loss in expected["losses"].items() if step > PAUSE_STEP}
    assert sorted(resumed["losses"]) == sorted(after)
    difference = first_difference({**expected, "losses": after}, resumed)
    assert difference is None, difference.describe()
