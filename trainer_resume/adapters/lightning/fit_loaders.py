"""Which training loaders a Lightning ``fit`` can resume exactly.

Lightning saves a training loader's position only when the loader has
``state_dict``/``load_state_dict``; any other loader restarts its epoch on resume,
so the resumed run trains on other batches than the uninterrupted one. Among the
stateful loaders, the bundled ``ResumableDataLoader(resumable=True)`` replays the
worker randomness from the position; others, such as torchdata's
``StatefulDataLoader``, restore the position only, so they are taken (like any loader
from elsewhere, see ``_declarations``) only when declared with
``declare_no_random_draws``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pytorch_lightning.utilities.rank_zero import rank_zero_warn

from ..._declarations import declared_no_random_draws
from ...errors import UnsupportedResumeConfigurationError
from ...loaders import ResumableDataLoader

__all__ = ["check_combined_mode", "check_train_loaders", "end_loader_epochs"]

_FIX = (
    "use trainer_resume.loaders.ResumableDataLoader(dataset, ..., resumable=True), "
    "DataLoader's drop-in (shuffle=True and torch's samplers give epochs; "
    "sampler=InfiniteRandomSampler(dataset, resumable=True) one endless stream)"
)


def _stateful(loader: Any) -> bool:
    # The same test as Lightning's ``_Stateful`` protocol, which decides what it saves.
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None)
    )


def _describe(index: int, loader: Any, count: int) -> str:
    name = type(loader).__name__
    return f"training loader {index} ({name})" if count > 1 else f"the training loader ({name})"


def check_train_loaders(loaders: Iterable[Any], *, strict: bool) -> None:
    """Refuse (or, with ``strict=False``, warn about) training loaders that cannot resume exactly.

    Args:
        loaders: The fit's training loaders (Lightning's ``CombinedLoader.flattened``).
        strict: Refuse a loader whose position cannot be saved; ``False`` warns instead.

    Raises:
        UnsupportedResumeConfigurationError: ``strict`` and a loader's position
            cannot be saved, or a loader from elsewhere was not declared with
            ``declare_no_random_draws`` (332).
    """
    loaders = list(loaders)
    for index, loader in enumerate(loaders):
        what = _describe(index, loader, len(loaders))
        if isinstance(loader, ResumableDataLoader):
            if loader.resumable:
                continue
            problem = f"{what} was built with resumable=False, so its position cannot be saved"
        elif _stateful(loader):
            if declared_no_random_draws(loader):
                continue  # its samples draw nothing: its own position is all a resume needs
            problem = (
                f"{what} saves its position, but not the random numbers its samples draw (its "
                "workers are reseeded at each iter()), so a resumed fit would differ wherever a "
                "sample draws one; if its samples draw no random numbers, declare it with "
                "trainer_resume.declare_no_random_draws(loader)"
            )
        else:
            problem = (
                f"{what} has no position Lightning can save (no state_dict/load_state_dict): "
                "a resumed fit "
                "would restart its epoch and train on other batches"
            )
        if strict:
            raise UnsupportedResumeConfigurationError(
                f"{problem}; {_FIX}, or pass ResumeCallback(..., strict=False) to accept an "
                "inexact resume"
            )
        rank_zero_warn(f"ResumeCallback(strict=False): {problem}; the resume will not be exact")


def check_combined_mode(
    mode: str, loaders: list[Any], *, strict: bool, epoch_batches: float = float("inf")
) -> None:
    """Refuse ``CombinedLoader(mode="max_size")`` over training loaders of unequal lengths.

    That mode gives ``None`` for a loader once its iterator is exhausted, until the
    longest one ends: no checkpoint holds which iterators are exhausted, so a fit
    resumed after one ran out would read that loader's next epoch instead (Lightning's
    own restart does the same). With equal lengths no iterator runs out early, nor
    where the fit's epochs (``epoch_batches``, ``limit_train_batches``) end before the
    shortest loader does.

    Raises:
        UnsupportedResumeConfigurationError: ``strict``, the mode is ``"max_size"`` and
            the loaders' lengths differ or are unknown (332); without ``strict`` a warning.
    """
    if mode != "max_size" or len(loaders) < 2:
        return
    try:
        lengths = {len(loader) for loader in loaders}
    except TypeError:  # a stream: where it ends is known only when it does
        lengths = set()
    if len(lengths) == 1 or (lengths and epoch_batches <= min(lengths)):
        return
    problem = (
        'CombinedLoader(mode="max_size") over training loaders of different lengths gives None '
        "for a loader once it is exhausted, which no checkpoint records: a fit resumed after "
        "that would read the loader's next epoch instead"
    )
    if strict:
        raise UnsupportedResumeConfigurationError(
            f'{problem}; use mode="max_size_cycle" (the default) or "min_size", or loaders of '
            "one length, or pass ResumeCallback(..., strict=False) to accept an inexact resume"
        )
    rank_zero_warn(f"ResumeCallback(strict=False): {problem}; the resume will not be exact")


def end_loader_epochs(loaders: Iterable[Any]) -> None:
    """Resumed at the last batch of a fit epoch: end the loaders' own epochs there too.

    In the uninterrupted fit the next epoch's ``iter(loader)`` replaces an iterator
    that delivered batches, so a loader whose epoch is longer than the fit's
    (``limit_train_batches``) starts its next epoch; the resumed fit's iterator has
    delivered nothing, so the loaders are told (``ResumableDataLoader.end_epoch``).
    """
    for loader in loaders:
        if isinstance(loader, ResumableDataLoader) and loader.resumable:
            loader.end_epoch()
