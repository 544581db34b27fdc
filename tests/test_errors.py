"""The error catalogue is a public contract: codes and messages are frozen here."""

from __future__ import annotations

import pickle

import pytest

from trainer_resume import errors
from trainer_resume.errors import (
    ERRORS_BY_CODE,
    CheckpointWriteError,
    LoaderStateError,
    ResumeError,
    TrainingPausedError,
    get_error_message,
)

# The specification. A code is never changed or reused; a retired code stays out of
# this table with a comment, and a new code is added with a new number.
FROZEN_CODES = {
    321: ("CheckpointFormatError", "not a pause checkpoint of this format"),
    322: ("CheckpointCorruptedError", "integrity check failed (truncated or altered bytes)"),
    323: ("ConfigSignatureMismatchError", "config differs from the paused run"),
    324: ("TrainingPausedError", "a training step was requested on a paused trainer"),
    325: ("TrainerLockedError", "a restore failed part-way; resume a good checkpoint first"),
    326: (
        "PauseBlockedError",
        "the last training step failed; pause is blocked until a step succeeds or a checkpoint is restored",
    ),
    327: ("CheckpointWriteError", "writing failed"),
    328: ("UnsafeCheckpointError", "the file holds objects outside the safe (weights-only) set"),
    329: ("VersionMismatchError", "module version differs"),
    330: (
        "ResumeStateMismatchError",
        "checkpoint entries do not match the trainer's objects/loaders/extras",
    ),
    331: (
        "ResumableModeRequiredError",
        "resumable sampler given to a non-resumable loader (or the reverse)",
    ),
    332: (
        "UnsupportedResumeConfigurationError",
        "configuration cannot be resumed exactly",
    ),
    333: ("LoaderStateError", "malformed loader/sampler state (format, cursor, index, sizes)"),
    334: ("IteratorInvalidatedError", "iterator used after close() or load_state_dict()"),
    335: (
        "LoaderFetchFailedError",
        "a batch fetch failed; close() then iter() resumes at the last delivered sample",
    ),
    336: (
        "LoaderCommitFailedError",
        "recording the consumed position failed; only load_state_dict() recovers",
    ),
    338: (
        "ResumableBatchConfigurationError",
        "empty dataset or settings that cannot produce a valid batch",
    ),
    339: (
        "CheckpointSignatureError",
        "a signing key was given and the file's signature (MAC) is missing or wrong",
    ),
    340: (
        "RunFinishedError",
        "the run is finished: there is nothing to resume (trainer_resume.run_finished "
        "tells; a requeued job can exit 0)",
    ),
    341: (
        "CheckpointNotDurableError",
        "the new checkpoint is in place, but its directory could not be synced; "
        "after a crash the previous checkpoint may reappear",
    ),
    348: (
        "ResumePointsInUseError",
        "another live process takes resume points into this directory; stop it first "
        "(a writer that died releases the directory; docs/resume-points.md says how to take over)",
    ),
    351: ("ResumableSamplerGeneratorError", "sampler RNG state corrupted"),
    352: (
        "FrameworkReleaseError",
        "the installed framework release lacks what its trainer-resume adapter relies on",
    ),
    353: (
        "StorageURLError",
        "this path reads as a URL that cannot be used: no installed fsspec implementation "
        "reads its scheme, or it is misspelt (a slash missing); the detail names the fix "
        "(the package to install, pip install 'trainer-resume[s3]' for s3://, the spelling, "
        "or a local path)",
    ),
    354: (
        "PauseNotResumableError",
        "the pause just written would be refused by resume() of the trainer that wrote it; "
        "a defect of trainer-resume: please report it with this message",
    ),
    355: (
        "StorageUnavailableError",
        "the storage behind this URL could not be reached or refused the request; nothing "
        "was read or changed: check the endpoint, the credentials and the network, then retry",
    ),
    359: (
        "DDPWindowError",
        "a DistributedDataParallel accumulation window cannot be resumed exactly here",
    ),
}


def _catalogue_classes() -> list[type[ResumeError]]:
    return [
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, ResumeError) and value is not ResumeError
    ]


def test_code_table_is_frozen():
    actual = {cls.code: (cls.__name__, cls.message) for cls in _catalogue_classes()}
    assert actual == FROZEN_CODES


def test_every_code_is_unique():
    codes = [cls.code for cls in _catalogue_classes()]
    assert len(codes) == len(set(codes))


def test_lookup_table_and_public_names_cover_the_whole_catalogue():
    assert {code: cls.__name__ for code, cls in ERRORS_BY_CODE.items()} == {
        code: name for code, (name, _) in FROZEN_CODES.items()
    }
    for name, _ in FROZEN_CODES.values():
        assert name in errors.__all__


def test_a_catalogue_class_with_a_taken_code_fails_when_it_is_defined():
    with pytest.raises(TypeError, match="error code 333 of TwinError is taken by LoaderStateError"):
        type(
            "TwinError",
            (ResumeError,),
            {"code": 333, "message": "m", "__module__": errors.__name__},
        )
    assert ERRORS_BY_CODE[333] is LoaderStateError


def test_a_catalogue_class_without_a_code_of_its_own_fails_when_it_is_defined():
    with pytest.raises(TypeError, match="CodelessError needs a code of its own"):
        type("CodelessError", (LoaderStateError,), {"message": "m", "__module__": errors.__name__})


def test_a_callers_subclass_is_no_catalogue_entry():
    class NarrowedError(LoaderStateError):
        code = 999

    assert 999 not in ERRORS_BY_CODE
    assert ERRORS_BY_CODE[333] is LoaderStateError


def test_public_names_are_the_catalogue_the_warnings_and_the_lookups():
    warnings = {
        "UnsavedStateWarning",
        "PauseSignalWarning",
        "SkippedCheckpointWarning",
        "WorldSizeChangeWarning",
        "UncheckedResumeWarning",
        "UntestedReleaseWarning",
    }
    catalogue = {name for name, _ in FROZEN_CODES.values()}
    assert sorted(errors.__all__) == sorted(
        {"ResumeError", *catalogue, *warnings, "ERRORS_BY_CODE", "get_error_message"}
    )
    for name in warnings:
        assert issubclass(getattr(errors, name), UserWarning)


@pytest.mark.parametrize("code", sorted(FROZEN_CODES))
def test_get_error_message_returns_the_fixed_message(code):
    assert get_error_message(code) == FROZEN_CODES[code][1]


@pytest.mark.parametrize("code", [0, 320, 337, 342, 360])
def test_get_error_message_refuses_an_unknown_code(code):
    with pytest.raises(KeyError, match=str(code)):
        get_error_message(code)


def test_str_without_detail_is_code_and_message():
    assert (
        str(LoaderStateError())
        == "[333] malformed loader/sampler state (format, cursor, index, sizes)"
    )


def test_str_with_detail_appends_it():
    error = LoaderStateError("consumed 7 != cycle*size+offset")
    assert str(error) == (
        "[333] malformed loader/sampler state (format, cursor, index, sizes): consumed 7 != cycle*size+offset"
    )
    assert error.detail == "consumed 7 != cycle*size+offset"


def test_bare_raise_gives_code_message_and_no_detail():
    with pytest.raises(TrainingPausedError) as caught:
        raise TrainingPausedError
    assert caught.value.detail is None
    assert str(caught.value) == "[324] a training step was requested on a paused trainer"
    assert isinstance(caught.value, ResumeError)


def test_cause_is_chained_with_from():
    cause = OSError(28, "No space left on device")
    with pytest.raises(CheckpointWriteError) as caught:
        try:
            raise cause
        except OSError as error:
            raise CheckpointWriteError("run/pause.ckpt") from error
    assert caught.value.__cause__ is cause


@pytest.mark.parametrize("code", sorted(FROZEN_CODES))
def test_pickle_round_trip_keeps_class_and_detail(code):
    error = ERRORS_BY_CODE[code](f"detail for {code}")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert copy.detail == f"detail for {code}"
    assert str(copy) == str(error)


def test_pickle_round_trip_without_detail():
    copy = pickle.loads(pickle.dumps(TrainingPausedError()))
    assert copy.detail is None
    assert str(copy) == "[324] a training step was requested on a paused trainer"
