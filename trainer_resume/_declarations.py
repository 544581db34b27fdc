"""What a user declares about a loader from elsewhere: its samples draw no random numbers.

A loader that is not the library's own (torchdata's ``StatefulDataLoader``, litdata's
or MosaicML's ``StreamingDataLoader``, anything with ``state_dict()`` /
``load_state_dict()``) saves its position through those methods, but not the random
numbers its samples draw in its workers: they are reseeded from the main process at
each ``iter()``, from generators that have moved on by then, so a resume would differ
wherever a sample draws one, and nothing can tell from the outside whether samples do.
Such a loader is therefore refused when training starts unless the user declares, with
:func:`declare_no_random_draws`, that its samples draw none. The mark is an attribute
of the loader, so it travels with the object wherever the trainer hands it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["declare_no_random_draws", "declared_no_random_draws"]

_NO_RANDOM_DRAWS = "_trainer_resume_no_random_draws"


def declare_no_random_draws(loader: Any) -> Any:
    """Declare that ``loader``'s samples draw no random numbers, so a trainer may take it.

    A loader from elsewhere (torchdata's ``StatefulDataLoader``, litdata's or MosaicML's
    ``StreamingDataLoader``, anything with ``state_dict()`` / ``load_state_dict()``)
    returned by ``_resume_loaders()``, or given to a Lightning fit, is saved and
    restored through those methods. They hold its position, not the random numbers its
    samples draw in its workers (a random crop, a masking of tokens): those are
    reseeded at each ``iter()`` and would differ after a resume. So such a loader is
    refused when training starts unless declared here; a
    :class:`~trainer_resume.loaders.ResumableDataLoader` needs no declaration (it
    replays them).

    Args:
        loader: The loader; it is marked and returned, so
            ``return {"train": declare_no_random_draws(self.loader)}`` reads as it does.

    Returns:
        ``loader`` itself.

    Raises:
        TypeError: ``loader`` has no ``state_dict()`` and ``load_state_dict()``, or
            cannot carry the mark (it takes no new attributes).
    """
    kind = f"{type(loader).__module__}.{type(loader).__qualname__}"
    if not (
        callable(getattr(loader, "state_dict", None))
        and callable(getattr(loader, "load_state_dict", None))
    ):
        raise TypeError(
            "declare_no_random_draws() takes a loader with state_dict() and load_state_dict(), "
            f"got a {kind}"
        )
    try:
        setattr(loader, _NO_RANDOM_DRAWS, True)
    except (AttributeError, TypeError) as error:
        raise TypeError(
            f"declare_no_random_draws() cannot mark a {kind} (it takes no new attributes); wrap "
            "it in an object that forwards state_dict() and load_state_dict()"
        ) from error
    return loader


def declared_no_random_draws(loader: Any) -> bool:
    """``loader`` was declared with :func:`declare_no_random_draws`."""
    return getattr(loader, _NO_RANDOM_DRAWS, False) is True
