"""A SIGTERM to the whole process group pauses exactly: loader workers do not die of it."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch
from support.signal_trainers import STEPS, STEPS_PER_EPOCH, GroupSignalTrainer
from torch.utils.data import TensorDataset

from trainer_resume import PauseSignalWarning, pause_signals_blocked
from trainer_resume.loaders import ResumableDataLoader
from trainer_resume.mixin import TrainingResumeMixin

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# (start method, workers, step): five steps with two fork workers, two of them an
# epoch's last step; spawn and forkserver workers get the signal while they are
# still starting up (step 0). One spawn worker: each imports torch anew.
PLAN = [("fork", 2, step) for step in (1, 3, STEPS_PER_EPOCH, 6, 2 * STEPS_PER_EPOCH)]
PLAN += [("spawn", 1, 0), ("forkserver", 2, 0)]


def run_child(workdir):
    code = textwrap.dedent(
        f"""
        from support.signal_trainers import child_main
        child_main({str(workdir)!r}, {PLAN!r})
        """
    )
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE]))
    # A session of its own: the child signals its process group, not pytest's.
    return subprocess.run(
        [sys.executable, "-c", code],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )


@pytest.mark.slow
def test_sigterm_to_the_process_group_pauses_exactly_with_two_workers(tmp_path):
    child = run_child(tmp_path)
    assert child.returncode == 0, child.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    expected_steps = [max(signal_at, 1) for _, _, signal_at in PLAN]
    assert [result["paused_at"] for result in results] == expected_steps
    assert [result.get("forkserver_alive") for result in results][-1] is True

    reference = GroupSignalTrainer()
    expected = [reference.step() for _ in range(STEPS)]
    assert torch.isfinite(torch.stack(expected)).all()
    for result in results:
        resumed = GroupSignalTrainer()
        resumed.resume(result["path"])
        losses = [resumed.step() for _ in range(STEPS - result["paused_at"])]
        assert all(torch.equal(a, b) for a, b in zip(expected[result["paused_at"] :], losses)), (
            result
        )
        for name, value in reference.model.state_dict().items():
            assert torch.equal(value, resumed.model.state_dict()[name]), (result, name)
        final = resumed.optimizer.state_dict()["state"]
        for index, entries in reference.optimizer.state_dict()["state"].items():
            assert torch.equal(entries["momentum_buffer"], final[index]["momentum_buffer"]), (
                result,
                index,
            )


class _Requests(TrainingResumeMixin):
    def __init__(self):
        self._initialize_training_resume({}, version="1")

    def _resume_objects(self):
        return {}

    def _resume_loaders(self):
        return {}


def test_a_signal_to_the_main_process_while_workers_start_is_not_lost(tmp_path):
    trainer = _Requests()
    with trainer.pause_on_signal(tmp_path / "pause.ckpt"):
        with pause_signals_blocked():
            os.kill(os.getpid(), signal.SIGTERM)
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        assert signal.SIGTERM in blocked
        # The signal is sent to the process: while this thread blocks it, any other thread
        # of the process (torch's, a hasher's) may take it, and the handler then runs here
        # at the next check, not necessarily at once. Not lost means it comes, boundedly.
        deadline = time.monotonic() + 30
        while not trainer.pause_requested and time.monotonic() < deadline:
            time.sleep(0.01)
        assert trainer.pause_requested
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_a_signal_pauses_every_trainer_of_the_process_that_armed_it(tmp_path):
    # Two trainers in one process, each armed for its own file: the second's handler
    # replaced the first's, and one SIGTERM paused the second only.
    first, second = _Requests(), _Requests()
    with first.pause_on_signal(tmp_path / "first.ckpt"):
        with second.pause_on_signal(tmp_path / "second.ckpt"):
            os.kill(os.getpid(), signal.SIGUSR1)
            deadline = time.monotonic() + 30
            while not second.pause_requested and time.monotonic() < deadline:
                time.sleep(0.01)
    assert first.pause_requested and second.pause_requested


def test_signals_armed_for_pauses_are_blocked_in_started_processes_too(tmp_path):
    trainer = _Requests()
    with trainer.pause_on_signal(tmp_path / "pause.ckpt", signals=(signal.SIGUSR2,)):
        with pause_signals_blocked():
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert {signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2} <= blocked


def _blocked_in(pid: int) -> set[signal.Signals]:
    """The signals process ``pid`` blocks, from ``/proc``."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        line = next(line for line in status if line.startswith("SigBlk:"))
    mask = int(line.split()[1], 16)
    return {number for number in signal.Signals if mask >> (number - 1) & 1}


def _started_workers() -> tuple[ResumableDataLoader, list[int]]:
    before = set(multiprocessing.active_children())
    loader = ResumableDataLoader(
        TensorDataset(torch.arange(16.0)), batch_size=2, num_workers=2, resumable=True
    )
    next(iter(loader))
    return loader, [child.pid for child in set(multiprocessing.active_children()) - before]


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_loader_workers_block_the_signals_a_terminal_or_launcher_sends_to_the_group():
    # Started before any pause_on_signal (the quickstart order: the iterator in
    # __init__), they must survive a Ctrl-C to the group that a later call turns into a
    # pause (SIGINT killed them, and the pause with them).
    loader, workers = _started_workers()
    try:
        assert len(workers) == 2
        for pid in workers:
            assert {
                signal.SIGTERM,
                signal.SIGUSR1,
                signal.SIGINT,
                signal.SIGHUP,
                signal.SIGUSR2,
            } <= (_blocked_in(pid))
    finally:
        loader.close()


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_arming_a_signal_that_running_workers_do_not_block_is_warned_about(tmp_path):
    # Workers inherit this process's ignored signals, and one that ignores SIGQUIT does
    # not die of it: a shell starts a background job with SIGINT and SIGQUIT ignored.
    previous = signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    try:
        _assert_arming_sigquit_is_warned_about(tmp_path)
    finally:
        signal.signal(signal.SIGQUIT, previous)


def _assert_arming_sigquit_is_warned_about(tmp_path):
    loader, workers = _started_workers()
    trainer = _Requests()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PauseSignalWarning)
            trainer.pause_on_signal(tmp_path / "pause.ckpt", signals=(signal.SIGINT,))
        with pytest.warns(PauseSignalWarning) as caught:
            trainer.pause_on_signal(tmp_path / "pause.ckpt", signals=(signal.SIGQUIT,))
        message = str(caught[0].message)
        assert message.startswith("_Requests.pause_on_signal(): a loader worker (pid ")
        assert "does not block SIGQUIT, so SIGQUIT sent to the whole process group kills it" in (
            message
        )
        assert int(message.split("(pid ")[1].split(")")[0]) in workers
    finally:
        trainer.restore_signal_handlers()
        loader.close()


def test_a_forkserver_started_without_the_block_is_warned_about(monkeypatch):
    from multiprocessing import forkserver

    bystander = subprocess.Popen(["sleep", "60"])  # stands in for a server started elsewhere
    try:
        monkeypatch.setattr(forkserver._forkserver, "_forkserver_pid", bystander.pid)
        with pytest.warns(PauseSignalWarning) as caught:
            with pause_signals_blocked("forkserver"):
                pass
    finally:
        bystander.kill()
        bystander.wait()
    assert str(caught[0].message) == (
        f"the multiprocessing forkserver (pid {bystander.pid}) was started without the pause signals "
        "blocked: a signal to the whole process group kills it, and with it every later DataLoader "
        "worker start; start it inside trainer_resume.pause_signals_blocked() (for example by starting "
        "the first loader's workers before anything else uses the forkserver)"
    )


def test_a_forkserver_started_inside_the_block_is_not_warned_about(monkeypatch):
    from multiprocessing import forkserver

    with pause_signals_blocked():
        protected = subprocess.Popen(["sleep", "60"])
    try:
        monkeypatch.setattr(forkserver._forkserver, "_forkserver_pid", protected.pid)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pause_signals_blocked("forkserver"):
                pass
    finally:
        protected.kill()
        protected.wait()


EXIT_WITH_LIVE_WORKERS = """
import torch
from trainer_resume.loaders import ResumableDataLoader

if __name__ == "__main__":
    loader = ResumableDataLoader(
        torch.arange(64.0), batch_size=4, shuffle=True, num_workers=2, resumable=True,
        multiprocessing_context={method!r},
    )
    batches = iter(loader)  # a global, still alive at exit: its workers are running then
    next(batches)
    print("fetched", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_interpreter_exit_with_workers_still_running_neither_hangs_nor_reports_them_killed(
    tmp_path, method
):
    # multiprocessing's exit handler stops daemon children with SIGTERM, which these
    # workers ignore; it would then wait for them forever.
    script = tmp_path / "child.py"
    script.write_text(EXIT_WITH_LIVE_WORKERS.format(method=method))
    environment = dict(os.environ, PYTHONPATH=ROOT)
    finished = subprocess.run(
        [sys.executable, str(script)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.strip() == "fetched"
    # Killing the workers at exit is not reported as a failure (torch's SIGCHLD handler
    # would say "DataLoader worker (pid N) is killed by signal: Killed").
    assert "Traceback" not in finished.stderr and "killed by signal" not in finished.stderr, (
        finished.stderr
    )
