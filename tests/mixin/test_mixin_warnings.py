"""Forgotten pieces are named: unsaved stateful attributes, unarmed steps, iterators not rebuilt."""

from __future__ import annotations

import time
import warnings

import pytest
import torch
from support.trainers import TinyTrainer
from torch import nn
from torch.utils.data import TensorDataset

from trainer_resume import UnsavedStateWarning
from trainer_resume.errors import IteratorInvalidatedError
from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader, ReuseDataLoader
from trainer_resume.mixin import TrainingResumeMixin


def unsaved_warnings(trainer, steps=3):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(steps):
            trainer.train_step()
    return [str(w.message) for w in caught if issubclass(w.category, UnsavedStateWarning)]


def unsaved_text(owner, attribute, kind):
    return (
        f"{owner}.{attribute} ({kind}) has state that no hook returns: pause() does not save it and "
        "resume() does not restore it, so a resumed run would differ; return it from _resume_objects() "
        "(or _resume_loaders()), or name it in _initialize_training_resume(..., excluded_attributes=...) "
        "if leaving it out is intended"
    )


class WithScheduler(TinyTrainer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=2)


def test_a_scheduler_no_hook_returns_is_warned_about_once_naming_the_attribute():
    assert unsaved_warnings(WithScheduler()) == [
        unsaved_text("WithScheduler", "scheduler", "StepLR")
    ]


def test_a_grad_scaler_in_a_list_attribute_is_named_with_its_index():
    class WithScalers(TinyTrainer):
        def __init__(self):
            super().__init__()
            self.scalers = [torch.amp.GradScaler("cpu", enabled=True)]

    assert unsaved_warnings(WithScalers()) == [
        unsaved_text("WithScalers", "scalers[0]", "GradScaler")
    ]


def test_reachable_and_empty_stateful_objects_are_not_reported():
    class Covered(TinyTrainer):
        def __init__(self):
            super().__init__()
            self.activation = nn.ReLU()  # a module without state
            self.scaler = torch.amp.GradScaler("cpu", enabled=False)  # empty state
            self.compiled = nn.Sequential(self.model)  # wraps the returned model
            data = TensorDataset(torch.randn(8, 4))
            self.sampler = InfiniteRandomSampler(data, resumable=True)  # the loader's sampler
            self.loader = ResumableDataLoader(
                data, batch_size=2, sampler=self.sampler, resumable=True
            )
            self.head = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
            self.first_layer = self.head[0]  # a submodule of a returned module

        def _resume_objects(self):
            return {**super()._resume_objects(), "head": self.head}

        def _resume_loaders(self):
            return {"train": self.loader}

    assert unsaved_warnings(Covered()) == []


def _loader_text(owner: str, attribute: str) -> str:
    return (
        f"{owner}.{attribute} (DataLoader) is a loader that no hook returns and that a resumed "
        "run starts over, in another order or from its first batch, so a resumed run would "
        "differ; build it as trainer_resume.loaders.ResumableDataLoader(..., resumable=True) and "
        "return it from _resume_loaders(), or name it in _initialize_training_resume(..., "
        "excluded_attributes=...) if leaving it out is intended"
    )


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(torch.randn(8, 4))


def test_a_torch_dataloader_that_shuffles_or_streams_and_no_hook_returns_is_warned_about():
    class Plain(TinyTrainer):
        def __init__(self):
            super().__init__()
            data = TensorDataset(torch.randn(8, 4))
            self.train_loader = torch.utils.data.DataLoader(data, batch_size=2, shuffle=True)
            self.stream = torch.utils.data.DataLoader(Stream(), batch_size=2)
            # An unshuffled loader read whole starts over alike in every run: not reported.
            self.val_loader = torch.utils.data.DataLoader(data, batch_size=2)

    assert unsaved_warnings(Plain()) == [
        _loader_text("Plain", "train_loader"),
        _loader_text("Plain", "stream"),
    ]


def _prepared(key):
    return torch.full((4,), float(key.index))


def test_a_loader_that_keeps_its_workers_between_passes_and_no_hook_returns_is_warned_about(
    tmp_path,
):
    # An evaluation loader with persistent workers: the resumed run starts them again,
    # drawing their seed from the main generator, and their generators start over.
    class Evaluating(TinyTrainer):
        def __init__(self):
            super().__init__()
            self.directory = tmp_path / "prepared"
            data = TensorDataset(torch.randn(8, 4))
            self.val_loader = torch.utils.data.DataLoader(
                data, batch_size=2, num_workers=2, persistent_workers=True
            )
            # Without workers, or without persistent ones, each pass starts alike.
            self.test_loader = torch.utils.data.DataLoader(data, batch_size=2, num_workers=2)
            self.other_loader = torch.utils.data.DataLoader(data, batch_size=2)
            # Samples built under their own seeds, workers seeded by no global generator:
            # not warned about its workers, but about its position (the epoch it serves).
            self.reused = ReuseDataLoader(
                _prepared, 8, self.directory, lifetime=2, seed=0, num_workers=2,
                persistent_workers=True, batch_size=2,
            )  # fmt: skip

    assert unsaved_warnings(Evaluating()) == [
        "Evaluating.val_loader (DataLoader) is a loader with persistent workers that no hook "
        "returns: their generators carry on from one pass to the next, and the main process's "
        "torch generator is drawn from (for their seed) only when they start, which a resumed "
        "run does again, so a resumed run would differ; build it with persistent_workers=False "
        "(an evaluation loader), or name it in _initialize_training_resume(..., "
        "excluded_attributes=...) if leaving it out is intended",
        "Evaluating.reused (ReuseDataLoader) has state that no hook returns: pause() does not "
        "save it and resume() does not restore it, so a resumed run would differ; return it "
        "from _resume_objects() (or _resume_loaders()), or name it in "
        "_initialize_training_resume(..., excluded_attributes=...) if leaving it out is intended",
    ]


def test_a_framework_wrapper_around_a_returned_loader_is_not_reported():
    class Wrapped(TinyTrainer):
        def __init__(self):
            super().__init__()
            data = TensorDataset(torch.randn(8, 4))
            self.loader = ResumableDataLoader(data, batch_size=2, shuffle=True, resumable=True)
            # What a framework's prepare() returns: another loader over the same dataset.
            self.prepared = torch.utils.data.DataLoader(data, batch_size=2, shuffle=True)

        def _resume_loaders(self):
            return {"train": self.loader}

    assert unsaved_warnings(Wrapped()) == []


class Configured(TrainingResumeMixin):
    def __init__(self, config, ignore):
        self._initialize_training_resume(config, version="1", config_ignore=ignore)

    def _resume_objects(self):
        return {}

    def _resume_loaders(self):
        return {}


@pytest.mark.parametrize("as_omegaconf", [False, True])
def test_a_config_ignore_path_the_config_does_not_have_is_warned_about_at_once(as_omegaconf):
    from omegaconf import OmegaConf

    config = {"paths": {"output_dir": "runs/1"}, "lr": 0.1, "a.b": {"c": 1}}
    config = OmegaConf.create(config) if as_omegaconf else config
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Configured(config, ["paths.ouput_dir", "lr", "nope"])
        # Present, an ancestor with its descendant, a quoted key: nothing to say.
        Configured(config, ["paths", "paths.output_dir", "['a.b'].c", "lr"])
    assert [(w.category, str(w.message)) for w in caught] == [
        (
            UnsavedStateWarning,
            "config_ignore names 'nope', 'paths.ouput_dir', which the config does not have: "
            "nothing is left out there, so a resume whose config differs at the key meant is "
            "refused (323); spell the path as a difference prints it (dotted mapping keys, e.g. "
            "'paths.output_dir')",
        )
    ]
    assert caught[0].filename == __file__  # where the trainer was configured


def test_attributes_named_as_excluded_are_not_reported():
    class Excluding(WithScheduler):
        def __init__(self):
            super().__init__()
            self._initialize_training_resume(
                self.config, version="1.0", excluded_attributes=("scheduler",)
            )

    assert unsaved_warnings(Excluding()) == []


def test_a_pause_before_the_first_step_warns_too(tmp_path):
    trainer = WithScheduler()
    with pytest.warns(UnsavedStateWarning) as caught:
        trainer.pause(tmp_path / "pause.ckpt")
    assert [str(w.message) for w in caught] == [
        unsaved_text("WithScheduler", "scheduler", "StepLR")
    ]


def test_extra_state_without_its_load_hook_is_warned_about():
    class NoLoad(TinyTrainer):
        _load_resume_extra_state = TrainingResumeMixin._load_resume_extra_state

    assert unsaved_warnings(NoLoad()) == [
        "NoLoad._resume_extra_state() returns ['position'] but NoLoad does not implement "
        "_load_resume_extra_state(state): resume() will refuse its pause files"
    ]


class Undecorated(TinyTrainer):
    def plain_step(self):  # the step without @training_step
        return TinyTrainer.train_step.__wrapped__(self)


def test_armed_signals_without_a_training_step_call_warn_that_pauses_cannot_land(tmp_path):
    trainer = Undecorated()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with trainer.pause_on_signal(tmp_path / "pause.ckpt", warn_without_step_after=0.05):
            for _ in range(3):
                trainer.plain_step()
            deadline = time.monotonic() + 10
            while not caught and time.monotonic() < deadline:
                time.sleep(0.01)
    assert [str(w.message) for w in caught] == [
        "Undecorated: pause signals are armed (pause_on_signal) but no @training_step call has started "
        "in 0.05 s: a signal only records a request, which is written when a @training_step call ends "
        "or by pause_if_requested(); decorate the training step with @training_step, or a SIGTERM will "
        "not pause this run"
    ]
    assert all(issubclass(w.category, UnsavedStateWarning) for w in caught)


def test_armed_signals_with_training_steps_do_not_warn(tmp_path):
    trainer = TinyTrainer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Long enough that a busy machine starts the step in time; then past the deadline.
        with trainer.pause_on_signal(tmp_path / "pause.ckpt", warn_without_step_after=1.0):
            trainer.train_step()
            time.sleep(1.3)
    assert caught == []


class LoaderTrainer(TinyTrainer):
    """Keeps an iterator over its loader but does not rebuild it after a resume."""

    def __init__(self):
        super().__init__()
        data = TensorDataset(torch.randn(12, 4))
        self.loader = ResumableDataLoader(
            data, batch_size=3, sampler=InfiniteRandomSampler(data, resumable=True), resumable=True
        )
        self.stream = iter(self.loader)

    def _resume_loaders(self):
        return {"train": self.loader}


def test_an_iterator_not_rebuilt_after_resume_names_the_missing_hook(tmp_path):
    source = LoaderTrainer()
    next(source.stream)
    source.train_step()
    source.pause(tmp_path / "pause.ckpt")
    trainer = LoaderTrainer()
    trainer.resume(tmp_path / "pause.ckpt")
    with pytest.raises(IteratorInvalidatedError) as raised:
        next(trainer.stream)
    assert str(raised.value) == (
        "[334] iterator used after close() or load_state_dict(): resume() restored the loaders and "
        "LoaderTrainer.stream still holds an iterator from before; recreate it in "
        "_rebuild_resume_iterators() (for example self.stream = iter(loader))"
    )
