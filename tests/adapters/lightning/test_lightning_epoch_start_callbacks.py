"""Lightning callbacks that act in ``on_train_epoch_start``, which a fit resumed in the
middle of an epoch skips: a ``GradientAccumulationScheduler`` (its accumulation changes
per epoch) resumes as the uninterrupted fit goes on, another fixed accumulation than the
paused fit's is refused, and ``StochasticWeightAveraging`` is refused before training (in
one process, fresh objects)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pytorch_lightning.callbacks import GradientAccumulationScheduler, StochasticWeightAveraging
from support import lightning_trace as trace

from trainer_resume.errors import ResumeStateMismatchError, UnsupportedResumeConfigurationError
from trainer_resume.testing import first_difference

# 6 batches per epoch: accumulation 1, then 2, then 3.
OPTIONS: dict[str, Any] = {"limit_train_batches": 6, "max_epochs": 3}


def _schedule() -> GradientAccumulationScheduler:
    return GradientAccumulationScheduler(scheduling={0: 1, 1: 2, 2: 3})


def _outcome(model: Any, trainer: Any) -> dict[str, Any]:
    return {
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optimizer": trainer.optimizers[0].state_dict(),
        "global_step": trainer.global_step,
        "rng_after": torch.rand(4),
    }


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Any], dict[str, Any]]:
    record: list[Any] = []
    trace.seed_everything()
    model, trainer, _, _ = trace.fit(
        tmp_path_factory.mktemp("uninterrupted"), record, resume=False, extra=[_schedule], **OPTIONS
    )
    return record, _outcome(model, trainer)


# Batch 8: mid-epoch 1 (accumulating 2); 15: mid-epoch 2 (3); 12: epoch 1's last.
@pytest.mark.parametrize("pause_at", [8, 12, 15])
def test_a_scheduled_accumulation_resumes_as_the_uninterrupted_fit(
    pause_at: int, tmp_path: Path, uninterrupted: tuple[list[Any], dict[str, Any]]
) -> None:
    expected_record, expected = uninterrupted
    record: list[Any] = []
    trace.seed_everything()
    _, _, callback, _ = trace.fit(
        tmp_path, record, pause_at_batch=pause_at, extra=[_schedule], **OPTIONS
    )
    assert callback is not None and callback.paused
    paused_record = list(record)
    torch.rand(7)  # a resume that forgot the RNG must not pass by luck
    record.clear()
    model, trainer, resumed, _ = trace.fit(
        tmp_path, record, ckpt_path=tmp_path / "pause.ckpt", extra=[_schedule], **OPTIONS
    )
    assert resumed is not None and not resumed.paused
    difference = first_difference(expected_record, paused_record + record)
    assert difference is None, difference
    difference = first_difference(expected, _outcome(model, trainer))
    assert difference is None, difference


def test_another_fixed_accumulation_than_the_paused_fits_is_refused(tmp_path: Path) -> None:
    record: list[Any] = []
    trace.seed_everything()
    trace.fit(tmp_path, record, pause_at_batch=4, accumulate_grad_batches=2, **OPTIONS)
    with pytest.raises(ResumeStateMismatchError, match="accumulate_grad_batches=2"):
        trace.fit(tmp_path, [], ckpt_path=tmp_path / "pause.ckpt", **OPTIONS)


def test_stochastic_weight_averaging_is_refused_before_training_naming_the_fix(
    tmp_path: Path,
) -> None:
    record: list[Any] = []
    trace.seed_everything()
    swa = lambda: StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=1)  # noqa: E731
    with pytest.raises(
        UnsupportedResumeConfigurationError, match="StochasticWeightAveraging"
    ) as caught:
        trace.fit(tmp_path, record, extra=[swa], **OPTIONS)
    assert "torch.optim.swa_utils.AveragedModel" in str(caught.value)
    assert not any(entry[0] == "train" for entry in record)  # before any training step
