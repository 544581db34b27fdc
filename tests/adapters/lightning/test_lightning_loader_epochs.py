"""A fit whose epochs are shorter than its loader's (``limit_train_batches``), paused on an
epoch's last batch or during validation, resumes as the uninterrupted fit: the next
fit epoch starts the loader's next epoch, as a new ``iter(loader)`` does there.

The loader is the ``shuffle=True`` drop-in with 8 batches per epoch; the fit takes 4
of them per epoch. In one process, with fresh objects, after the generators moved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from support import lightning_child as child
from support import lightning_trace as trace

from trainer_resume.testing import first_difference


def _loader() -> Any:
    return child.build_epoch_loader(workers=0, size=32, batch_size=4)


LIMITED = {"limit_train_batches": 4}
# name: (trainer options, pause requested after this training batch, or in this validation batch)
SCENARIOS: dict[str, tuple[dict[str, Any], dict[str, int]]] = {
    "last_limited_batch_with_validation": (LIMITED, {"pause_at_batch": 4}),
    "last_limited_batch_without_validation": (
        {**LIMITED, "limit_val_batches": 0},
        {"pause_at_batch": 4},
    ),
    "last_limited_batch_of_the_last_epoch": ({**LIMITED, "max_epochs": 2}, {"pause_at_batch": 8}),
    "last_limited_batch_with_a_validation_interval": (
        {**LIMITED, "val_check_interval": 2},
        {"pause_at_batch": 4},
    ),
    "during_the_validation_at_an_epoch_end": (LIMITED, {"pause_in_validation": 2}),
    "during_a_validation_inside_an_epoch": (
        {**LIMITED, "val_check_interval": 2},
        {"pause_in_validation": 1},
    ),
}


def _outcome(model: Any, trainer: Any) -> dict[str, Any]:
    return {
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optimizer": trainer.optimizers[0].state_dict(),
        "lr_schedulers": [config.scheduler.state_dict() for config in trainer.lr_scheduler_configs],
        "rng_after": torch.rand(4),
    }


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_limited_epoch_paused_at_its_end_or_in_validation_resumes_as_the_uninterrupted_fit(
    scenario: str, tmp_path: Path
) -> None:
    options, pause = SCENARIOS[scenario]
    expected_record: list[Any] = []
    trace.seed_everything()
    model, trainer, _, _ = trace.fit(
        tmp_path / "reference", expected_record, train=_loader, resume=False, **options
    )
    expected = _outcome(model, trainer)

    record: list[Any] = []
    trace.seed_everything()
    _, _, callback, _ = trace.fit(tmp_path, record, train=_loader, **pause, **options)
    assert callback is not None and callback.paused
    paused_record = list(record)
    torch.rand(7)  # a resume that forgot the RNG must not pass by luck

    record.clear()
    model, trainer, resumed, _ = trace.fit(
        tmp_path, record, train=_loader, ckpt_path=tmp_path / "pause.ckpt", **options
    )
    assert resumed is not None and not resumed.paused
    difference = first_difference(expected_record, paused_record + record)
    assert difference is None, difference
    difference = first_difference(expected, _outcome(model, trainer))
    assert difference is None, difference
