"""Lightning Fabric's ``_FabricDataLoader``, read through the ``ResumableDataLoader`` inside it.

``fabric.setup_dataloaders(loader)`` wraps a loader in a ``_FabricDataLoader`` that
iterates it (``_dataloader``), moves each batch to Fabric's device and, before each
iteration, sets the epoch of its sampler (and its batch sampler's sampler) to the number
of times it was iterated (``_num_iter_calls``). Under a distributed strategy it first
rebuilds the loader (a ``ResumableDataLoader`` stays one, resumable) around a
``DistributedSampler``.

Returned from ``_resume_loaders()``, such a wrapper around a
``ResumableDataLoader(..., resumable=True)`` is read through :class:`FabricLoaderView`
(registered with ``checks.hook_results``): its state is the inner loader's delivered
position, and a resume also sets the wrapper's iteration count to the inner loader's
epoch, so Fabric orders the resumed epoch and the later ones as in the uninterrupted run.
A ``DistributedSampler``'s epoch comes back with the loader's state; any other sampler
whose epoch Fabric would set is refused, as is a wrapper around a loader whose position
cannot be saved (the refusal names the loader to wrap).

Fabric internals used (``lightning_fabric`` 2.5.3 to 2.6): ``_FabricDataLoader._dataloader``
and ``_num_iter_calls`` (set on resume) and what ``_FabricDataLoader.__iter__`` does with them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_fabric.wrappers import _FabricDataLoader
from torch.utils.data import DistributedSampler

from ...checks.hook_results import loader_view, register_loader_hint, register_loader_view
from ...loaders import ResumableDataLoader
from ...state import LoaderState

__all__ = ["FabricLoaderView", "fabric_loader_hint", "fabric_loader_view", "loader_epoch"]


class FabricLoaderView:
    """A ``_FabricDataLoader`` around a ``ResumableDataLoader``, as the trainer reads it.

    Its state is that of :attr:`loader`, the resumable loader Fabric's wrapper iterates.
    Built by :func:`fabric_loader_view`; the trainer builds one wherever it reads the
    wrapper returned from ``_resume_loaders()``.
    """

    def __init__(self, wrapper: _FabricDataLoader) -> None:
        self.wrapper = wrapper
        self.loader: ResumableDataLoader = wrapper._dataloader

    @property
    def dataset(self) -> Any:
        return self.loader.dataset

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads (``ResumableDataLoader.epoch``)."""
        return self.loader.epoch

    @property
    def epoch_ended(self) -> bool:
        """The inner loader just delivered its epoch's last batch (``ResumableDataLoader.epoch_ended``)."""
        return self.loader.epoch_ended

    @property
    def wrapper_keeps(self) -> str | None:
        """What Fabric's wrapper keeps of the position, if anything: returning the loader
        inside it instead is refused."""
        if not _epoch_set_parts(self.loader):
            return None
        return (
            "Fabric numbers the epochs of its DistributedSampler by the wrapper's count of "
            "iterations, which only the wrapper's own resume brings back"
        )

    def close(self) -> None:
        """Stop the inner loader's workers (``ResumableDataLoader.close``)."""
        self.loader.close()

    def state_dict(self) -> LoaderState:
        """The inner loader's delivered position (``ResumableDataLoader.state_dict``)."""
        return self.loader.state_dict()

    def validate_state_dict(self, state: Mapping[str, Any]) -> None:
        """Check ``state`` completely; changes nothing (``ResumableDataLoader.validate_state_dict``)."""
        self.loader.validate_state_dict(state)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Move the inner loader to ``state``'s position, and Fabric's iteration count to its epoch.

        Fabric numbers a sampler's epochs by its iterations of the loader: a loop that
        iterates it once per epoch (as Fabric's do) gave epoch ``e`` the number ``e``, so
        the next iteration, of the loaded epoch (part-way: the same one again), gets the
        number the uninterrupted run gave it. A part-way epoch whose recorded number
        differs (a loop that iterated the loader more often) is refused by the inner
        loader when the resumed epoch starts (``LoaderStateError``, 333).
        """
        self.loader.load_state_dict(state)
        self.wrapper._num_iter_calls = self.loader.epoch


def _epoch_set_parts(loader: Any) -> list[Any]:
    # The parts _set_sampler_epoch (lightning_fabric.utilities.data) gives an epoch.
    batch_sampler = getattr(loader, "batch_sampler", None)
    parts = (getattr(loader, "sampler", None), getattr(batch_sampler, "sampler", None))
    return [part for part in parts if callable(getattr(part, "set_epoch", None))]


def _unsupported(wrapper: _FabricDataLoader) -> str | None:
    """Why the trainer cannot read ``wrapper`` through its inner loader, or ``None``."""
    inner = wrapper._dataloader
    if not isinstance(inner, ResumableDataLoader):
        kind = type(inner)
        return (
            f"fabric.setup_dataloaders wrapped a {kind.__module__}.{kind.__qualname__}, whose "
            "position cannot be saved: pass fabric.setup_dataloaders a "
            "trainer_resume.loaders.ResumableDataLoader(..., resumable=True) (the DataLoader "
            "drop-in, with the same arguments) and return the loader it returns"
        )
    if not inner.resumable:
        return (
            "fabric.setup_dataloaders wrapped a ResumableDataLoader built with resumable=False: "
            "build it with resumable=True and return the loader fabric.setup_dataloaders returns"
        )
    for part in _epoch_set_parts(inner):
        if type(part) is not DistributedSampler:
            return (
                f"Fabric sets the epoch of its {type(part).__name__} at every iteration from the "
                "number of iterations, which the loader's state does not record: use a "
                "DistributedSampler or a sampler without set_epoch"
            )
    return None


def fabric_loader_view(loader: Any) -> FabricLoaderView | None:
    """The view of a ``_FabricDataLoader`` around a resumable loader, else ``None`` (a loader view)."""
    if not isinstance(loader, _FabricDataLoader) or _unsupported(loader) is not None:
        return None
    return FabricLoaderView(loader)


def fabric_loader_hint(loader: Any) -> str | None:
    """The fix for a ``_FabricDataLoader`` the trainer cannot read, else ``None`` (a loader hint)."""
    if not isinstance(loader, _FabricDataLoader):
        return None
    return _unsupported(loader)


def loader_epoch(loader: Any) -> int:
    """The epoch the next iteration of ``loader`` reads, for an epoch loop's ``range``.

    ``for epoch in range(loader_epoch(loader), epochs):`` continues a resumed run at the
    epoch it paused in. Takes what ``fabric.setup_dataloaders`` (or
    :func:`~trainer_resume.adapters.fabric.setup_dataloaders`) returned around a
    ``ResumableDataLoader``, or a ``ResumableDataLoader``.

    Raises:
        TypeError: ``loader`` is neither.
    """
    seen = loader_view(loader)
    if not isinstance(seen, (FabricLoaderView, ResumableDataLoader)):
        fix = fabric_loader_hint(loader)
        raise TypeError(
            f"loader_epoch takes a ResumableDataLoader or Fabric's loader around one, got "
            f"{type(loader).__name__}" + (f" ({fix})" if fix else "")
        )
    return seen.epoch


register_loader_view(fabric_loader_view)
register_loader_hint(fabric_loader_hint)
