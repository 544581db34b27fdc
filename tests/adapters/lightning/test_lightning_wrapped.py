"""A LightningModule whose network is wrapped (here by DataParallel, which over no GPU only
calls it) pauses under the unwrapped names and resumes into the network wrapped or not.

Without the GPUs it would spread the batch over, ``DataParallel`` changes the names of the
module's state (``net.module.0.weight``) and nothing else; ``torch.compile`` changes them
alike (``net._orig_mod.0.weight``) through the same renaming, tested with compiled steps in
``tests/mixin/test_mixin_compiled.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from support import lightning_child as child
from torch import nn

from trainer_resume.adapters.lightning import ResumeCallback
from trainer_resume.checkpoint_files.lightning import plain_lightning_checkpoint
from trainer_resume.testing import first_difference

STEPS, PAUSE = 6, 3


class WrappedRegressor(child.Regressor):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.DataParallel(self.net)


class _RequestPauseAt(pl.Callback):
    def __init__(self, resume: ResumeCallback) -> None:
        self.resume = resume

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == PAUSE:
            self.resume.request_pause()


def _fit(directory: Path, kind: type, *, pause: bool = False, resume: bool = False) -> dict:
    """A fit to ``STEPS`` (paused after ``PAUSE``, or resumed from the pause file); its losses,
    and its weights and Adam state by parameter order, which no wrapper changes."""
    torch.manual_seed(child.SEED + (1 if resume else 0))  # a resume must bring the weights
    model = kind()
    callback = ResumeCallback(directory / "pause.ckpt", signals=(), config=child.CONFIG)
    callbacks: list[pl.Callback] = [_RequestPauseAt(callback), callback] if pause else [callback]
    trainer = child.build_trainer(steps=STEPS, epoch_batches=0, callbacks=callbacks)
    loader = child.build_loader(workers=0)
    trainer.fit(model, loader, ckpt_path=callback.ckpt_path if resume else None)
    loader.close()
    return {
        "losses": dict(model.losses),
        "weights": [p.detach().clone() for p in model.parameters()],
        "optimizer": trainer.optimizers[0].state_dict(),
        "global_step": trainer.global_step,
    }


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _fit(tmp_path_factory.mktemp("uninterrupted"), child.Regressor)


@pytest.mark.parametrize(
    ("paused_kind", "resumed_kind"),
    [(WrappedRegressor, child.Regressor), (child.Regressor, WrappedRegressor)],
)
def test_a_lightning_pause_resumes_bitwise_equal_into_the_network_wrapped_or_not(
    tmp_path, uninterrupted, paused_kind, resumed_kind
):
    paused = _fit(tmp_path, paused_kind, pause=True)
    assert paused["global_step"] == PAUSE
    names = list(plain_lightning_checkpoint(tmp_path / "pause.ckpt")["state_dict"])
    assert names == list(child.Regressor().state_dict())  # net.0.weight, never net.module.
    resumed = _fit(tmp_path, resumed_kind, resume=True)
    expected = {
        **uninterrupted,
        "losses": {k: v for k, v in uninterrupted["losses"].items() if k > PAUSE},
    }
    difference = first_difference(expected, resumed)
    assert difference is None, difference.describe()
