"""A pause at any training batch resumes as the uninterrupted fit goes on: the validation
due after the paused batch, the epoch end, ModelCheckpoint/EarlyStopping, logged
metrics and the RNG see the same sequence (in one process, fresh objects)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from support import lightning_trace as trace

from trainer_resume.testing import first_difference

# name: (trainer options, the training batch after which the pause is requested)
SCENARIOS: dict[str, tuple[dict[str, Any], int]] = {
    # 4 batches per epoch, validation after each epoch.
    "last_batch_of_an_epoch_with_validation": ({}, 4),
    "last_batch_of_a_later_epoch_with_validation_and_max_steps": (
        {"max_steps": 10, "max_epochs": -1},
        8,
    ),
    "mid_epoch_with_per_epoch_validation": ({}, 6),
    "last_batch_of_an_epoch_without_validation": ({"limit_val_batches": 0}, 4),
    # One endless epoch, validation every 2 batches.
    "validation_interval_step": (
        {
            "max_steps": 8,
            "max_epochs": -1,
            "limit_train_batches": None,
            "val_check_interval": 2,
            "check_val_every_n_epoch": None,
        },
        4,
    ),
    # The request at batch 5 lands mid-accumulation; the pause waits for batch 6.
    "mid_accumulation": ({"accumulate_grad_batches": 2}, 5),
}


def _monitor_states(monitors: list[Any]) -> list[Any]:
    states = []
    for callback in monitors:
        state = dict(callback.state_dict())
        for key in ("dirpath", "best_model_path", "last_model_path", "kth_best_model_path"):
            if key in state:
                state[key] = Path(state[key]).name if state[key] else state[key]
        if "best_k_models" in state:
            state["best_k_models"] = {
                Path(path).name: score for path, score in state["best_k_models"].items()
            }
        states.append(state)
    return states


def _outcome(model: Any, trainer: Any, monitors: list[Any]) -> dict[str, Any]:
    return {
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optimizer": trainer.optimizers[0].state_dict(),
        "lr_schedulers": [config.scheduler.state_dict() for config in trainer.lr_scheduler_configs],
        "loops": trainer.fit_loop.state_dict(),
        "monitors": _monitor_states(monitors),
        "rng_after": torch.rand(4),
    }


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cache: dict[str, tuple[list[Any], dict[str, Any]]] = {}

    def run(scenario: str) -> tuple[list[Any], dict[str, Any]]:
        if scenario not in cache:
            options, _ = SCENARIOS[scenario]
            record: list[Any] = []
            trace.seed_everything()
            model, trainer, _, monitors = trace.fit(
                tmp_path_factory.mktemp(scenario), record, resume=False, **options
            )
            cache[scenario] = record, _outcome(model, trainer, monitors)
        return cache[scenario]

    return run


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_pause_and_resume_continue_as_the_uninterrupted_fit(
    scenario: str, tmp_path: Path, uninterrupted: Any
) -> None:
    options, pause_at = SCENARIOS[scenario]
    expected_record, expected = uninterrupted(scenario)

    record: list[Any] = []
    trace.seed_everything()
    _, _, callback, _ = trace.fit(tmp_path, record, pause_at_batch=pause_at, **options)
    assert callback is not None and callback.paused
    paused_record = list(record)
    # The paused process ends right after the paused batch: no validation, no epoch end.
    assert paused_record[-1][0] == "train"
    torch.rand(7)  # a resume that forgot the RNG must not pass by luck

    record.clear()
    model, trainer, resumed, monitors = trace.fit(
        tmp_path, record, ckpt_path=tmp_path / "pause.ckpt", **options
    )
    assert resumed is not None and not resumed.paused
    difference = first_difference(expected_record, paused_record + record)
    assert difference is None, difference
    difference = first_difference(expected, _outcome(model, trainer, monitors))
    assert difference is None, difference


def test_a_pause_requested_mid_accumulation_waits_for_the_optimizer_step(tmp_path: Path) -> None:
    options, pause_at = SCENARIOS["mid_accumulation"]
    trace.seed_everything()
    _, trainer, callback, _ = trace.fit(tmp_path, [], pause_at_batch=pause_at, **options)
    assert callback is not None and callback.paused_at_step == 3 and trainer.global_step == 3
    assert trainer.fit_loop.epoch_loop.batch_progress.total.completed == pause_at + 1


class _EpochLogged(trace.Traced):
    """Epoch-level training metrics of every reduction, a persistent torchmetrics metric
    among them; the metrics each epoch ended with are recorded at the next epoch's start."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        from torchmetrics import MeanMetric

        self.mean = MeanMetric()
        self.mean.persistent(True)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("train_mean", loss, on_step=False, on_epoch=True)
        self.log("train_max", loss, on_step=True, on_epoch=True, reduce_fx="max", prog_bar=True)
        self.log("train_sum", 2 * loss, on_step=False, on_epoch=True, reduce_fx="sum")
        self.mean(loss)
        self.log("train_metric", self.mean, on_step=False, on_epoch=True)
        if batch_idx % 2 == 1:  # Lightning logs its last step value again at the others
            self.log("train_odd", loss, on_step=True, on_epoch=True)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # What the loggers get for this step (a CSV row).
        logged = self.trainer._logger_connector.metrics["log"]
        self.record.append(("logged", self.global_step, self.current_epoch, dict(logged)))

    def on_train_epoch_start(self) -> None:
        super().on_train_epoch_start()
        metrics = {k: v.clone() for k, v in self.trainer.callback_metrics.items()}
        self.record.append(("metrics", self.global_step, self.current_epoch, metrics))


@pytest.mark.parametrize("pause_at", [2, 4, 8], ids=["mid_epoch", "epoch_end", "later_epoch_end"])
def test_epoch_level_training_metrics_resume_their_accumulation_without_a_warning(
    pause_at: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trace, "Traced", _EpochLogged)
    expected_record: list[Any] = []
    trace.seed_everything()
    model, trainer, _, monitors = trace.fit(tmp_path / "reference", expected_record, resume=False)
    expected = {**_outcome(model, trainer, monitors), "metrics": dict(trainer.callback_metrics)}
    assert {"train_mean", "train_max_epoch", "train_sum", "train_metric"} <= set(
        expected["metrics"]
    )

    record: list[Any] = []
    trace.seed_everything()
    trace.fit(tmp_path, record, pause_at_batch=pause_at)
    paused_record = list(record)
    record.clear()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*epoch-level values")
        model, trainer, _, monitors = trace.fit(tmp_path, record, ckpt_path=tmp_path / "pause.ckpt")
    # Each epoch's values over all its batches, the paused process's included.
    difference = first_difference(expected_record, paused_record + record)
    assert difference is None, difference
    actual = {**_outcome(model, trainer, monitors), "metrics": dict(trainer.callback_metrics)}
    difference = first_difference(expected, actual)
    assert difference is None, difference


class _NotSaved(trace.Traced):
    """An epoch-level metric kept by a torchmetrics metric whose states the module does not save."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        from torchmetrics import MeanMetric

        self.mean = MeanMetric()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.mean(loss)
        self.log("train_mean", self.mean, on_step=False, on_epoch=True)
        return loss
        return loss


class _PersistentMean(trace.Traced):
    """An epoch-level mean kept by a torchmetrics metric of the module, made persistent."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        from torchmetrics import MeanMetric

        self.mean = MeanMetric()
        self.mean.persistent(True)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.mean(loss)
        self.log("train_mean", self.mean, on_step=False, on_epoch=True)
        return loss


def test_an_epoch_level_metric_the_module_saves_resumes_its_accumulation_without_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trace, "Traced", _PersistentMean)
    trace.seed_everything()
    _, expected, *_ = trace.fit(tmp_path / "reference", [], resume=False)
    trace.seed_everything()
    trace.fit(tmp_path, [], pause_at_batch=2)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*epoch-level values")
        _, resumed, *_ = trace.fit(tmp_path, [], ckpt_path=tmp_path / "pause.ckpt")
    # The epoch's mean over every batch, the paused process's included.
    value = expected.callback_metrics["train_mean"]
    assert torch.equal(resumed.callback_metrics["train_mean"], value)


def test_a_resume_warns_about_epoch_level_training_metrics_it_cannot_carry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trace, "Traced", _NotSaved)
    trace.seed_everything()
    trace.fit(tmp_path, [], pause_at_batch=2)
    with pytest.warns(UserWarning, match=r"epoch-level values of \['train_mean'\]"):
        trace.fit(tmp_path, [], ckpt_path=tmp_path / "pause.ckpt")


def test_each_rank_resumes_its_own_last_logged_metrics_and_an_earlier_releases_file_rank_0s():
    from types import SimpleNamespace

    from trainer_resume.adapters.lightning.metrics import restore_logged_metrics

    def restored(state: Any, rank: int) -> dict[str, Any]:
        connector = SimpleNamespace()
        trainer = SimpleNamespace(_logger_connector=connector, global_rank=rank, world_size=2)
        restore_logged_metrics(trainer, state, torch.device("cpu"))  # type: ignore[arg-type]
        return connector._callback_metrics

    by_rank = [
        {"callback": {"loss": torch.tensor(float(rank))}, "logged": {}, "progress_bar": {}}
        for rank in range(2)
    ]
    assert [restored(by_rank, rank)["loss"].item() for rank in range(2)] == [0.0, 1.0]
    assert restored(by_rank[0], 1)["loss"].item() == 0.0  # one state for all ranks
