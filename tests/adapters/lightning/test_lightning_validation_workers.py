"""A fit whose validation loader keeps its workers (``persistent_workers=True``) resumes
exactly: every validation starts them, in the uninterrupted fit and the resumed one.

Kept from one validation to the next, their generators carried on and their seed was
drawn from the main generator at the first validation only; the resumed fit started
them again, so its validations drew other samples and its training, one draw later,
other dropout masks, silently.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from support import lightning_child as child
from support.lightning_trace import RequestPauseAt
from torch.utils.data import DataLoader, Dataset, TensorDataset

from trainer_resume.adapters.lightning import ResumeCallback
from trainer_resume.difference import first_difference
from trainer_resume.loaders import ResumableDataLoader

pytestmark = pytest.mark.slow  # validation workers start at every validation


class Drawn(Dataset):
    """Validation samples drawn at random in the workers."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(4), torch.randn(1)


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1)
        )
        self.losses: list[torch.Tensor] = []
        self.validated: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.losses.append(loss.detach().clone())
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.validated.append(self.net(batch[0]).detach().clone())

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(folder: Path, pause_at: int | None = None) -> Regression:
    torch.manual_seed(1)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    train = ResumableDataLoader(data, batch_size=4, shuffle=True, resumable=True)
    validation = DataLoader(Drawn(), batch_size=4, num_workers=2, persistent_workers=True)
    resume = ResumeCallback(folder / "pause.ckpt", config={"workers": 2})
    module = Regression()
    trainer = child.build_trainer(
        steps=-1,
        epoch_batches=0,
        max_epochs=3,
        callbacks=[*([RequestPauseAt(pause_at, resume)] if pause_at else []), resume],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, train, validation, ckpt_path=resume.ckpt_path)
    return module


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Regression:
    return _fit(tmp_path_factory.mktemp("reference"))


# Batch 8: the first epoch's last, its validation left pending; batch 10: after it.
@pytest.mark.parametrize("batch", [8, 10])
def test_validation_workers_kept_between_validations_resume_as_the_fit_validated(
    tmp_path: Path, reference: Regression, batch: int
) -> None:
    paused = _fit(tmp_path, pause_at=batch)
    resumed = _fit(tmp_path)
    for name, expected, got in (
        ("losses", reference.losses, paused.losses + resumed.losses),
        ("validated", reference.validated, paused.validated + resumed.validated),
        ("weights", reference.state_dict(), resumed.state_dict()),
    ):
        difference = first_difference(expected, got)
        assert difference is None, f"{name}: {difference.describe()}"
