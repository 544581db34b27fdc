"""The adapters work with the framework releases users install: each checks, when it is
imported, every internal it reads; a missing or changed one is refused naming it and the
fix, a newer release than the tested ones warns once and works."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import accelerate
import accelerate.utils
import pytest
import pytorch_lightning
import torch
from accelerate.accelerator import Accelerator
from accelerate.state import GradientState
from lightning_fabric.wrappers import _FabricDataLoader
from nvidia.dali.external_source import ExternalSource
from nvidia.dali.pipeline import Pipeline
from pytorch_lightning.loops.fit_loop import _FitLoop
from pytorch_lightning.loops.training_epoch_loop import _TrainingEpochLoop
from transformers import Trainer

import trainer_resume.adapters
from trainer_resume import FrameworkReleaseError, UntestedReleaseWarning
from trainer_resume.adapters import _release
from trainer_resume.adapters import accelerate as accelerate_adapter
from trainer_resume.adapters import dali as dali_adapter
from trainer_resume.adapters import fabric as fabric_adapter
from trainer_resume.adapters import lightning as lightning_adapter
from trainer_resume.adapters import transformers as transformers_adapter
from trainer_resume.testing import first_difference

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

# adapter: (its module, its extra)
ADAPTERS = {
    "accelerate": (accelerate_adapter, "accelerate"),
    "transformers": (transformers_adapter, "transformers"),
    "lightning": (lightning_adapter, "lightning"),
    "fabric": (fabric_adapter, "lightning"),
    "dali": (dali_adapter, "dali"),
}
# adapter: an internal it reads, as (owner, attribute), deleted to fake a release without it
MISSING = {
    "accelerate": (GradientState, "_add_dataloader"),
    "transformers": (Trainer, "_maybe_log_save_evaluate"),
    "lightning": (_TrainingEpochLoop, "_should_accumulate"),
    "fabric": (_FabricDataLoader, "__iter__"),
    "dali": (Pipeline, "_pipes"),
}


@pytest.fixture(autouse=True)
def _no_warnings_given_yet(monkeypatch):
    # "Once per process": each test starts as a process that has warned about nothing.
    monkeypatch.setattr(_release, "_WARNED", set())


def import_afresh(monkeypatch, adapter: str):
    """Import ``trainer_resume.adapters.<adapter>`` again, running its release check again."""
    package = f"trainer_resume.adapters.{adapter}"
    for name in [name for name in sys.modules if name == package or name.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, name)
    # The package attribute is set again by a successful import: put the first one back after.
    monkeypatch.setattr(trainer_resume.adapters, adapter, getattr(trainer_resume.adapters, adapter))
    return importlib.import_module(package)


def check(adapter: str) -> None:
    module, extra = ADAPTERS[adapter]
    _release.check_release(
        module.RELEASES, adapter=adapter, extra=extra, internals=module.INTERNALS
    )


def test_importing_the_accelerate_adapter_refuses_a_release_without_an_internal_it_reads(
    monkeypatch,
):
    monkeypatch.setattr(accelerate, "__version__", "1.16.0")
    monkeypatch.delattr(GradientState, "_add_dataloader")
    with pytest.raises(ImportError) as caught:
        import_afresh(monkeypatch, "accelerate")
    assert isinstance(caught.value, FrameworkReleaseError) and caught.value.code == 352
    assert caught.value.detail == (
        "trainer_resume.adapters.accelerate relies on internals of accelerate that accelerate "
        "1.16.0 lacks or has changed: accelerate.state.GradientState._add_dataloader is missing. "
        "accelerate 1.15.0 to 1.16.0, the releases it is tested with, have them: pip install "
        "'accelerate>=1.15.0,<1.17', or a trainer-resume release that supports accelerate 1.16.0"
    )


@pytest.mark.parametrize("adapter", list(MISSING))
def test_each_adapter_refuses_at_import_a_release_without_an_internal_naming_it_and_the_fix(
    monkeypatch, adapter
):
    owner, attribute = MISSING[adapter]
    module = ADAPTERS[adapter][0]
    monkeypatch.delattr(owner, attribute)
    with pytest.raises(FrameworkReleaseError) as caught:
        import_afresh(monkeypatch, adapter)
    detail = caught.value.detail
    assert f"{owner.__module__}.{owner.__qualname__}.{attribute} is missing" in detail
    assert f"{module.RELEASES.tested_range}, the releases it is tested with, have them" in detail
    assert f"pip install '{module.RELEASES.tested_requirement}'" in detail


def test_a_method_whose_parameters_changed_is_refused_naming_its_signature(monkeypatch):
    def _run_epoch(self, model, epoch, loader, steps, num_update_steps_per_epoch, **kwargs):
        pass

    monkeypatch.setattr(Trainer, "_run_epoch", _run_epoch)
    with pytest.raises(FrameworkReleaseError) as caught:
        check("transformers")
    assert (
        "transformers.trainer.Trainer._run_epoch(model, epoch, loader, steps, "
        "num_update_steps_per_epoch, **kwargs) has no parameter 'train_dataloader', "
        "'steps_in_epoch'" in caught.value.detail
    )


def test_a_method_called_with_arguments_it_no_longer_takes_is_refused(monkeypatch):
    monkeypatch.setattr(GradientState, "_remove_dataloader", lambda self: None)
    with pytest.raises(FrameworkReleaseError) as caught:
        check("accelerate")
    assert (
        "accelerate.state.GradientState._remove_dataloader() cannot be called with 1 positional "
        "argument" in caught.value.detail
    )


def test_a_keyword_the_adapter_passes_that_only_kwargs_would_take_is_refused(monkeypatch):
    def send_to_device(tensor, device, **kwargs):
        return tensor

    monkeypatch.setattr(accelerate.utils, "send_to_device", send_to_device)
    with pytest.raises(FrameworkReleaseError) as caught:
        check("accelerate")
    assert (
        "accelerate.utils.send_to_device(tensor, device, **kwargs) has no parameter "
        "'non_blocking'" in caught.value.detail
    )


def test_a_framework_that_is_not_installed_is_named_with_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "accelerate", None)  # import accelerate now fails
    with pytest.raises(ImportError) as caught:
        check("accelerate")
    assert not isinstance(caught.value, FrameworkReleaseError)
    assert str(caught.value) == (
        "trainer_resume.adapters.accelerate needs accelerate>=1.15.0: "
        "pip install 'trainer-resume[accelerate]'"
    )


def test_a_property_the_adapter_sets_that_lost_its_setter_is_refused(monkeypatch):
    monkeypatch.setattr(Accelerator, "sync_gradients", property(lambda self: True))
    with pytest.raises(FrameworkReleaseError) as caught:
        check("accelerate")
    assert (
        "accelerate.accelerator.Accelerator.sync_gradients is a property without a setter"
        in caught.value.detail
    )


def test_an_override_the_framework_no_longer_calls_is_refused(monkeypatch):
    # Lightning's fit loop calls on_advance_end, which a pause replaces for one epoch end.
    monkeypatch.setattr(_FitLoop, "run", lambda self: None)
    with pytest.raises(FrameworkReleaseError) as caught:
        check("lightning")
    assert (
        "pytorch_lightning.loops.fit_loop._FitLoop.run no longer refers to on_advance_end"
        in caught.value.detail
    )


def test_an_attribute_the_framework_no_longer_assigns_is_refused(monkeypatch):
    # DALI's external_source puts the callback on its operator; a source fed by
    # feed_input has none, and is refused. Without the attribute every source would be.
    def call(self, *args, **kwargs):
        return None

    monkeypatch.setattr(ExternalSource, "__call__", call)
    with pytest.raises(FrameworkReleaseError) as caught:
        check("dali")
    assert "nvidia.dali.ops._OperatorInstance._callback is missing" in caught.value.detail


def test_a_release_below_the_floor_is_refused_with_what_it_lacks(monkeypatch):
    monkeypatch.setattr(pytorch_lightning, "__version__", "2.5.2")
    with pytest.raises(FrameworkReleaseError) as caught:
        import_afresh(monkeypatch, "lightning")
    assert caught.value.detail == (
        "trainer_resume.adapters.lightning needs pytorch-lightning 2.5.3 or later and found 2.5.2 "
        "(earlier releases lack Lightning's own fixes to resumed loop counters (2.5.0) and to the "
        "double iteration on resume (2.5.3)): pip install -U 'pytorch-lightning>=2.5.3'"
    )


def test_a_newer_accelerate_release_warns_once_naming_the_tested_releases(monkeypatch):
    monkeypatch.setattr(accelerate, "__version__", "1.17.0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check("accelerate")
        check("accelerate")
    given = [item for item in caught if item.category is UntestedReleaseWarning]
    assert [str(item.message) for item in given] == [
        "trainer_resume.adapters.accelerate is tested with accelerate 1.15.0 to 1.16.0 and found "
        "1.17.0: every internal it reads is there with the shape it relies on, so it works; a "
        "change in what they do is not checked. Check your resume against an uninterrupted run "
        "(trainer_resume.testing.assert_training_resume), or pip install "
        "'accelerate>=1.15.0,<1.17'"
    ]


@pytest.mark.parametrize("adapter", list(ADAPTERS))
def test_each_adapter_warns_for_a_newer_release_and_not_for_a_tested_one(monkeypatch, adapter):
    module = ADAPTERS[adapter][0]
    # The module the check imports (transformers replaces the one its import first made).
    framework = importlib.import_module(module.RELEASES.package)
    major, minor, _ = _release._release(module.RELEASES.tested)
    for version, warned in [(f"{major}.{minor}.7", False), (f"{major}.{minor + 1}.0", True)]:
        monkeypatch.setattr(framework, "__version__", version)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check(adapter)
        given = [str(item.message) for item in caught if item.category is UntestedReleaseWarning]
        assert len(given) == warned, (version, given)
        if warned:
            releases = module.RELEASES
            assert (
                f"tested with {releases.distribution} {releases.tested_range} and found {version}:"
                in given[0]
            )


@pytest.mark.slow
def test_with_a_newer_accelerate_release_a_pause_inside_a_window_resumes_exactly(tmp_path):
    results = tmp_path / "results.pt"
    done = subprocess.run(
        [sys.executable, "-m", "support.newer_release", "1.17.0", str(results)],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)])),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = torch.load(results, weights_only=True)
    assert len(record["warnings"]) == 1
    assert "is tested with accelerate 1.15.0 to 1.16.0 and found 1.17.0" in record["warnings"][0]
    assert len(record["resumed"]["losses"]) == len(record["expected"]["losses"])
    assert first_difference(record["expected"], record["resumed"]) is None


def _requirements(extra: str) -> list[str]:
    """The requirements of one extra, as pyproject.toml lists them."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    line = re.search(rf"^{extra} = \[(.*)\]$", text, re.MULTILINE)
    assert line is not None, f"no one-line extra {extra!r} in pyproject.toml"
    return re.findall(r'"([^"]+)"', line.group(1))


@pytest.mark.parametrize(
    "extra, frameworks",
    [
        ("accelerate", [_release.ACCELERATE]),
        ("transformers", [_release.TRANSFORMERS, _release.ACCELERATE]),
        ("lightning", [_release.LIGHTNING]),
        ("dali", [_release.DALI]),
    ],
)
def test_each_extra_requires_its_frameworks_floor_and_caps_no_release(extra, frameworks):
    assert _requirements(extra) == [
        f"{framework.distribution}>={framework.floor}" for framework in frameworks
    ]


def test_the_lightning_extra_installs_the_fabric_adapters_framework_at_its_floor():
    # Lightning Fabric comes with pytorch-lightning: one requirement serves both adapters.
    fabric = _release.FABRIC
    assert _requirements("lightning") == [f"{fabric.distribution}>={fabric.floor}"]


@pytest.mark.parametrize(
    "adapter, page",
    [
        ("accelerate", "accelerate.md"),
        ("transformers", "transformers.md"),
        ("lightning", "lightning.md"),
        ("fabric", "fabric.md"),
        ("dali", "dali.md"),
    ],
)
def test_each_adapter_page_names_its_tested_releases_and_what_a_newer_one_does(adapter, page):
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    releases = ADAPTERS[adapter][0].RELEASES
    assert f"{releases.distribution}>={releases.floor}" in text
    assert releases.tested_range in text
    assert "UntestedReleaseWarning" in text
    assert "FrameworkReleaseError" in text
    assert "INTERNALS" in text
