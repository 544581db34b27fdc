"""Resume-domain errors with stable numeric codes, and the package's warnings.

Every failure that concerns pausing or resuming has its own subclass of
:class:`ResumeError` with a class-level ``code`` and a fixed ``message``. An
instance may add a ``detail`` (which key differs, which file). Codes are part of
the public contract: a retired code's number is never reused. Argument mistakes
stay ``TypeError`` / ``ValueError``.

Each error class registers itself in :data:`ERRORS_BY_CODE` when it is defined (a
code used twice fails the import), and ``__all__`` is read off the classes defined
here, so the catalogue is written once: as its classes. The warnings the package
issues are defined here too.
"""

from __future__ import annotations

from typing import Any, ClassVar

# Filled by ResumeError.__init_subclass__: every catalogue class, by its code.
ERRORS_BY_CODE: dict[int, type[ResumeError]] = {}


class ResumeError(Exception):
    """Base class of every resume-domain error.

    Args:
        detail: Optional specifics (the differing key, the file, the index).
    """

    code: ClassVar[int] = 0
    message: ClassVar[str] = "resume error"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__module__ != __name__:
            return  # a caller narrowing one of ours: no entry of the catalogue
        if "code" not in cls.__dict__:
            raise TypeError(f"{cls.__name__} needs a code of its own")
        taken = ERRORS_BY_CODE.get(cls.code)
        if taken is not None:
            raise TypeError(f"error code {cls.code} of {cls.__name__} is taken by {taken.__name__}")
        ERRORS_BY_CODE[cls.code] = cls

    def __init__(self, detail: str | None = None) -> None:
        self.detail = detail
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"[{self.code}] {self.message}"
        return f"{text}: {self.detail}" if self.detail else text

    def __reduce__(self):  # keep detail when the error crosses a process boundary
        return (type(self), (self.detail,))


class CheckpointFormatError(ResumeError):
    code = 321
    message = "not a pause checkpoint of this format"


class CheckpointCorruptedError(ResumeError):
    code = 322
    message = "integrity check failed (truncated or altered bytes)"


class ConfigSignatureMismatchError(ResumeError):
    code = 323
    message = "config differs from the paused run"


class TrainingPausedError(ResumeError):
    code = 324
    message = "a training step was requested on a paused trainer"


class TrainerLockedError(ResumeError):
    code = 325
    message = "a restore failed part-way; resume a good checkpoint first"


class PauseBlockedError(ResumeError):
    code = 326
    message = (
        "the last training step failed; pause is blocked until a step succeeds "
        "or a checkpoint is restored"
    )


class CheckpointWriteError(ResumeError):
    code = 327
    # The detail says whether a previous checkpoint at that path is intact.
    message = "writing failed"


class CheckpointNotDurableError(CheckpointWriteError):
    # A CheckpointWriteError, so callers that retry failed writes retry this one too.
    code = 341
    message = (
        "the new checkpoint is in place, but its directory could not be synced; "
        "after a crash the previous checkpoint may reappear"
    )


class UnsafeCheckpointError(ResumeError):
    code = 328
    message = "the file holds objects outside the safe (weights-only) set"


class VersionMismatchError(ResumeError):
    code = 329
    message = "module version differs"


class ResumeStateMismatchError(ResumeError):
    code = 330
    message = "checkpoint entries do not match the trainer's objects/loaders/extras"


class ResumableModeRequiredError(ResumeError):
    code = 331
    message = "resumable sampler given to a non-resumable loader (or the reverse)"


class UnsupportedResumeConfigurationError(ResumeError):
    code = 332
    # The detail names the cause (the loader, object or setting) and the fix.
    message = "configuration cannot be resumed exactly"


class LoaderStateError(ResumeError):
    code = 333
    message = "malformed loader/sampler state (format, cursor, index, sizes)"


class IteratorInvalidatedError(ResumeError):
    code = 334
    message = "iterator used after close() or load_state_dict()"


class LoaderFetchFailedError(ResumeError):
    code = 335
    message = "a batch fetch failed; close() then iter() resumes at the last delivered sample"


class LoaderCommitFailedError(ResumeError):
    code = 336
    message = "recording the consumed position failed; only load_state_dict() recovers"


class ResumableBatchConfigurationError(ResumeError):
    code = 338
    message = "empty dataset or settings that cannot produce a valid batch"


class CheckpointSignatureError(ResumeError):
    code = 339
    message = "a signing key was given and the file's signature (MAC) is missing or wrong"


class RunFinishedError(ResumeError):
    code = 340
    message = (
        "the run is finished: there is nothing to resume (trainer_resume.run_finished "
        "tells; a requeued job can exit 0)"
    )


class ResumePointsInUseError(ResumeError):
    code = 348
    message = (
        "another live process takes resume points into this directory; stop it first "
        "(a writer that died releases the directory; docs/resume-points.md says how to take over)"
    )


class ResumableSamplerGeneratorError(ResumeError):
    code = 351
    message = "sampler RNG state corrupted"


class FrameworkReleaseError(ResumeError, ImportError):
    """An adapter's framework is a release it cannot work with: below the adapter's floor,
    or without an internal the adapter reads (or with another shape of it). Raised when
    the adapter is imported, so it is an ``ImportError`` too."""

    code = 352
    message = "the installed framework release lacks what its trainer-resume adapter relies on"


class StorageURLError(ResumeError):
    """A path that names a place through a URL scheme (``s3://...``) with no fsspec
    implementation installed for it, one fsspec does not know, or one misspelt
    (``s3:/bucket``). Refused where the path is given, so it never becomes a local folder
    named after the scheme."""

    code = 353
    message = (
        "this path reads as a URL that cannot be used: no installed fsspec implementation "
        "reads its scheme, or it is misspelt (a slash missing); the detail names the fix "
        "(the package to install, pip install 'trainer-resume[s3]' for s3://, the spelling, "
        "or a local path)"
    )


class PauseNotResumableError(ResumeError):
    """The checks ``resume()`` runs, run on a pause just written against the trainer that
    wrote it, refused it: a pause that no resume would accept (a defect, never a setting)."""

    code = 354
    message = (
        "the pause just written would be refused by resume() of the trainer that wrote it; "
        "a defect of trainer-resume: please report it with this message"
    )


class StorageUnavailableError(ResumeError, OSError):
    """Object storage did not answer whether, or what, a URL holds: the endpoint could not
    be reached, or the request was refused (credentials). Never taken for "no such file":
    a run that cannot see its pause file does not start over. An ``OSError`` too."""

    code = 355
    message = (
        "the storage behind this URL could not be reached or refused the request; nothing "
        "was read or changed: check the endpoint, the credentials and the network, then retry"
    )


class DDPWindowError(ResumeError):
    """DistributedDataParallel's record of an open accumulation window (the parameters its
    reducer found used under ``no_sync``) cannot be carried into this run; the detail names
    the wrapper's setting or what the trainer must hold, and the fix."""

    code = 359
    message = "a DistributedDataParallel accumulation window cannot be resumed exactly here"


# ----------------------------------------------------------------------- warnings


class UnsavedStateWarning(UserWarning):
    """Something a resume needs is not saved, or a pause cannot land."""


class PauseSignalWarning(UserWarning):
    """A process that may die on a pause signal sent to the whole process group."""


class SkippedCheckpointWarning(UserWarning):
    """A damaged or foreign file in a resume-point directory was skipped for an older one."""


class WorldSizeChangeWarning(UserWarning):
    """A pause is resumed with another number of ranks: sample-exact, not bit-comparable."""


class UncheckedResumeWarning(UserWarning):
    """A configuration could not be checked for an exact resume (another library's
    internals were not as expected); the text names what could not be checked."""


class UntestedReleaseWarning(UserWarning):
    """A framework release newer than the newest its adapter is tested with: everything the
    adapter reads is there, so it works; the text names the tested releases."""


def get_error_message(code: int) -> str:
    """Return the fixed message of an error code.

    Raises:
        KeyError: ``code`` is not in the catalogue.
    """
    try:
        return ERRORS_BY_CODE[code].message
    except KeyError:
        raise KeyError(f"unknown trainer-resume error code {code}") from None


# Every error and warning class above is public, in the order defined: no second list.
__all__ = [
    *(
        name
        for name, value in list(globals().items())
        if isinstance(value, type)
        and issubclass(value, (ResumeError, Warning))
        and value.__module__ == __name__
    ),
    "ERRORS_BY_CODE",
    "get_error_message",
]
