"""The example trainer resumes bit-identically, and assert_training_resume catches broken resumes."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from support.example_trainers import (
    CYCLE,
    DrawsOnIterator,
    DropsOptimizerState,
    RestoresRngBeforeIterators,
    SkipsLoaderState,
    SkipsRngRestore,
    factory,
    run_step,
    small_config,
    snapshot,
)

from trainer_resume.durable import load_checkpoint, save_checkpoint
from trainer_resume.errors import ConfigSignatureMismatchError, LoaderStateError
from trainer_resume.example import ExampleTrainer, default_config, run_training
from trainer_resume.mixin import _resume
from trainer_resume.testing import (
    assert_training_resume,
    first_difference,
    max_abs_difference,
)

TOTAL = 14


@pytest.fixture(autouse=True)
def restore_thread_count():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


PAUSE_POINTS = [1, 3, CYCLE + CYCLE // 2, 2 * CYCLE]  # 1, 3, mid-cycle, cycle end


@pytest.mark.parametrize("pause_after", PAUSE_POINTS)
def test_example_trainer_resumes_bit_identically_in_process(tmp_path, pause_after):
    assert_training_resume(
        factory(), run_step, tmp_path / "pause.ckpt", pause_after, TOTAL, snapshot
    )


@pytest.mark.slow
# In a new process: mid-pass and at a pass's end (the two kinds of loader position; the
# early points are the in-process test's).
@pytest.mark.parametrize("pause_after", PAUSE_POINTS[2:])
def test_example_trainer_resumes_bit_identically_in_a_new_process(tmp_path, pause_after):
    assert_training_resume(
        factory(),
        run_step,
        tmp_path / "pause.ckpt",
        pause_after,
        TOTAL,
        snapshot,
        new_process=True,
        timeout=300,
    )


def test_dropping_optimizer_state_is_caught_naming_the_optimizer(tmp_path):
    with pytest.raises(
        AssertionError, match=r"right after resume \(step 3\): optimizer/state differs"
    ):
        assert_training_resume(
            factory(DropsOptimizerState), run_step, tmp_path / "p.ckpt", 3, 6, snapshot
        )


def test_skipping_the_rng_restore_is_caught_naming_the_generator(tmp_path):
    with pytest.raises(
        AssertionError,
        match=r"right after resume \(step 3\): rng/python differs.*max abs difference",
    ):
        assert_training_resume(
            factory(SkipsRngRestore), run_step, tmp_path / "p.ckpt", 3, 6, snapshot
        )


def test_skipping_the_loader_state_is_caught_naming_the_loader(tmp_path):
    with pytest.raises(AssertionError, match=r"right after resume \(step 3\): loader/\S+ differs"):
        assert_training_resume(
            factory(SkipsLoaderState), run_step, tmp_path / "p.ckpt", 3, 6, snapshot
        )


def test_iterator_creation_that_draws_random_numbers_resumes_exactly_because_rng_is_restored_last(
    tmp_path,
):
    assert_training_resume(factory(DrawsOnIterator), run_step, tmp_path / "p.ckpt", 3, 6, snapshot)


def test_restoring_rng_before_the_iterators_is_caught_naming_the_generator(tmp_path):
    with pytest.raises(
        AssertionError,
        match=r"right after resume \(step 3\): rng/torch differs.*max abs difference",
    ):
        assert_training_resume(
            factory(RestoresRngBeforeIterators), run_step, tmp_path / "p.ckpt", 3, 6, snapshot
        )


def test_resume_under_a_changed_config_is_refused_naming_the_path(tmp_path):
    trainer = ExampleTrainer(small_config())
    trainer.train_step()
    trainer.pause(tmp_path / "pause.ckpt")
    trainer.close()
    changed = small_config()
    changed["optimizer"]["lr"] = 0.01
    other = ExampleTrainer(changed)
    try:
        with pytest.raises(
            ConfigSignatureMismatchError, match=r"optimizer\.lr: 0\.003 in the paused run, 0\.01"
        ):
            other.resume(tmp_path / "pause.ckpt")
    finally:
        other.close()


def test_run_training_resumes_exactly_where_a_weights_only_resume_diverges(tmp_path):
    config = small_config()
    path = tmp_path / "pause.ckpt"
    threads = torch.get_num_threads()
    reference = run_training(config, steps=10)
    assert torch.get_num_threads() == threads  # run_training puts the process setting back
    paused = run_training(config, steps=10, pause_path=path, pause_after=4)
    exact = run_training(config, steps=10, resume_path=path)
    weights_only = run_training(config, steps=10, weights_only_path=path)
    assert paused.paused and paused.completed_steps == 4 and paused.losses == reference.losses[:4]
    assert exact.first_step == 5 and exact.losses == reference.losses[4:]
    assert first_difference(reference.snapshot, exact.snapshot) is None
    assert weights_only.first_step == 5 and len(weights_only.losses) == 6
    assert max_abs_difference(reference.snapshot["model"], weights_only.snapshot["model"]) > 0


def test_run_training_pauses_on_sigterm_at_the_step_it_waits_at(tmp_path):
    path = tmp_path / "pause.ckpt"
    previous = signal.getsignal(signal.SIGTERM)

    def send_sigterm(step, loss):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    result = run_training(
        small_config(),
        steps=10,
        pause_path=path,
        handle_signals=True,
        wait_for_pause_after=3,
        on_step=send_sigterm,
    )
    assert result.paused and result.completed_steps == 3 and path.exists()
    assert signal.getsignal(signal.SIGTERM) is previous
    resumed = run_training(small_config(), steps=10, resume_path=path)
    reference = run_training(small_config(), steps=10)
    assert result.losses + resumed.losses == reference.losses


def test_run_training_without_a_wait_pauses_at_the_next_step_boundary(tmp_path):
    path = tmp_path / "pause.ckpt"

    def send_sigusr1(step, loss):
        if step == 2:
            os.kill(os.getpid(), signal.SIGUSR1)

    result = run_training(
        small_config(), steps=10, pause_path=path, handle_signals=True, on_step=send_sigusr1
    )
    assert result.paused and result.completed_steps == 3


def test_bundled_config_has_every_section_the_trainer_reads():
    config = default_config()
    assert list(config) == [
        "load",
        "data",
        "model",
        "optimizer",
        "scheduler",
        "amp",
        "loader",
        "train",
        "pause",
    ]
    assert config.loader.num_workers == 2 and config.amp.dtype == "bfloat16"
    assert list(config.pause.signals) == ["SIGTERM", "SIGUSR1"]


@pytest.fixture
def paused_example(tmp_path):
    trainer = ExampleTrainer(small_config())
    try:
        for _ in range(3):
            trainer.train_step()
        trainer.pause(tmp_path / "pause.ckpt")
    finally:
        trainer.close()
    return tmp_path / "pause.ckpt"


def test_malformed_loader_state_is_refused_before_anything_is_restored(paused_example, tmp_path):
    checkpoint = load_checkpoint(paused_example)
    checkpoint["loaders"]["train"]["delivered_batches"] += 1
    save_checkpoint(checkpoint, tmp_path / "bad.ckpt")
    trainer = ExampleTrainer(small_config())
    try:
        trainer.train_step()
        before = trainer.snapshot()
        with pytest.raises(LoaderStateError):
            trainer.resume(tmp_path / "bad.ckpt")
        difference = first_difference(before, trainer.snapshot())
        assert difference is None, difference.describe()
        assert not trainer.locked
        assert first_difference(before["rng"], trainer.snapshot()["rng"]) is None
    finally:
        trainer.close()


def test_grad_scaler_is_restored_through_restore_grad_scaler_state_with_the_optimizer(
    paused_example, monkeypatch
):
    calls = []
    real = _resume.restore_grad_scaler_state

    def recording(scaler, state, optimizers):
        calls.append((scaler, state["scale"], list(optimizers)))
        real(scaler, state, optimizers)

    monkeypatch.setattr(_resume, "restore_grad_scaler_state", recording)
    trainer = ExampleTrainer(small_config())
    try:
        trainer.resume(paused_example)
        assert calls == [(trainer.scaler, trainer.scaler.get_scale(), [trainer.optimizer])]
        assert (
            trainer.scaler.get_scale() != small_config()["amp"]["init_scale"]
        )  # the scale did move in 3 steps
    finally:
        trainer.close()
