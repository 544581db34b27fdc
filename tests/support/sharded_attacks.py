"""Attacks on and failures of a 2-rank sharded pause, all in one launch of the ranks.

Module level on purpose: the ranks find its functions by name. Every rank pauses one
FSDP2 run, then each scenario builds a fresh trainer (one step taken, so any change
shows), tries the resume (or a pause) and records the error, whether the rank's
local state changed and whether the trainer is locked. Rank 0 prepares the
scenario's files between barriers; the tampering helpers are the attacker's side
and use the full pickler on purpose.
"""

from __future__ import annotations

import errno
import io
import os
import pickle
import shutil
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from support.ddp_workers import _capture_stderr, join_group
from support.fsdp_workers import FSDPTrainer, _local
from trainer_resume.durable import load_checkpoint, save_checkpoint
from trainer_resume.errors import ResumeError
from trainer_resume.sharded.manifest import file_entry
from trainer_resume.testing import first_difference

PAUSED_AT = 2
# The scenarios a resume is refused in, in the order the ranks run them.
REFUSALS = (
    "metadata_payload",
    "byte_entry_payload",
    "shard_rewritten_after_verification",
    "shard_left_out_of_manifest",
    "rank_file_deleted",
    "metadata_deleted",
)


class Payload:
    """Pickles as a call that creates ``marker``: what an attacker's object does when unpickled."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"import pathlib; pathlib.Path({self.marker!r}).touch()", {}))


def generation(pause: Path) -> Path:
    return pause / load_checkpoint(pause / "manifest.ckpt")["generation"]


def recommit_unsigned(pause: Path, *, drop: tuple[str, ...] = ()) -> None:
    """Recompute every file's digest (left out: ``drop``) and save the manifest unsigned,
    as anyone who can write the directory can without a key."""
    manifest = load_checkpoint(pause / "manifest.ckpt")
    directory = generation(pause)
    files = {}
    for name in manifest["files"]:
        if name not in drop:
            files[name] = file_entry(str(directory / name))
    manifest["files"] = files
    save_checkpoint(manifest, pause / "manifest.ckpt")


def _metadata(pause: Path) -> Any:
    return pickle.loads((generation(pause) / "dcp" / ".metadata").read_bytes())


def _write_metadata(pause: Path, metadata: Any) -> None:
    (generation(pause) / "dcp" / ".metadata").write_bytes(pickle.dumps(metadata))


def put_payload_in_metadata(pause: Path, marker: str) -> None:
    metadata = _metadata(pause)
    metadata.planner_data = {"payload": Payload(marker), **(metadata.planner_data or {})}
    _write_metadata(pause, metadata)
    recommit_unsigned(pause)


def put_payload_in_byte_entry(pause: Path, marker: str, fqn: str) -> None:
    """Replace DCP byte entry ``fqn`` by a pickle of ``Payload``: its file is rebuilt and the
    offsets of the entries after it moved."""
    metadata = _metadata(pause)
    storage = metadata.storage_data
    [index] = [index for index in storage if index.fqn == fqn]
    shard = generation(pause) / "dcp" / storage[index].relative_path
    data = shard.read_bytes()
    payload = io.BytesIO()
    torch.save({"value": Payload(marker)}, payload)
    entries = sorted(
        (info.offset, key)
        for key, info in storage.items()
        if info.relative_path == storage[index].relative_path
    )
    end = max(storage[key].offset + storage[key].length for _, key in entries)
    rebuilt = bytearray()
    for _, key in entries:
        info = storage[key]
        piece = (
            payload.getvalue() if key == index else data[info.offset : info.offset + info.length]
        )
        info.offset, info.length = len(rebuilt), len(piece)
        rebuilt += piece
    rebuilt += data[end:]
    shard.write_bytes(bytes(rebuilt))
    _write_metadata(pause, metadata)
    recommit_unsigned(pause)


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _fail_shard_writes_on(rank: int) -> Callable[[], None]:
    """This rank's DCP shard writes fail with ENOSPC until the returned function is called."""
    from torch.distributed.checkpoint import filesystem

    real = filesystem._write_item

    def full_disk(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    if dist.get_rank() == rank:
        filesystem._write_item = full_disk

    def undo() -> None:
        filesystem._write_item = real

    return undo


def _rewrite_shard_after_verification(path: Path) -> Callable[[], None]:
    """Rank 0 rewrites ``path`` once every rank verified and agreed, before DCP reads it."""
    from trainer_resume.sharded import read

    real = read.ShardedPause.load

    def load(self: Any, objects: Any) -> Any:
        if dist.get_rank() == 0:
            flip_byte(path)
        return real(self, objects)

    read.ShardedPause.load = load  # type: ignore[method-assign]

    def undo() -> None:
        read.ShardedPause.load = real  # type: ignore[method-assign]

    return undo


def _prepare(scenario: str, pause: Path, copy: Path, marker: str) -> Callable[[], None]:
    """Rank 0: the scenario's pause directory at ``copy``; every rank: the returned undo."""
    if dist.get_rank() == 0:
        shutil.copytree(pause, copy)
        shards = generation(copy) / "dcp"
        if scenario == "metadata_payload":
            put_payload_in_metadata(copy, marker)
        elif scenario == "byte_entry_payload":
            put_payload_in_byte_entry(copy, marker, "optimizers.model.param_groups.0.lr")
        elif scenario == "shard_left_out_of_manifest":
            recommit_unsigned(copy, drop=("dcp/__1_0.distcp",))
        elif scenario == "rank_file_deleted":
            os.remove(generation(copy) / "rank-1.ckpt")
        elif scenario == "metadata_deleted":
            os.remove(shards / ".metadata")
    dist.barrier()
    if scenario == "shard_rewritten_after_verification":
        return _rewrite_shard_after_verification(generation(copy) / "dcp" / "__1_0.distcp")
    return lambda: None


def _refused(trainer: FSDPTrainer, attempt: Callable[[], None]) -> dict[str, Any]:
    before = _local(trainer.state())
    result: dict[str, Any] = {"error": None}
    try:
        attempt()
    except ResumeError as error:
        result["error"] = f"{type(error).__name__}: {error}"
    result["unchanged"] = first_difference(before, _local(trainer.state())) is None
    result["locked"] = trainer.locked
    return result


def _fresh(trainers: list[FSDPTrainer]) -> FSDPTrainer:
    trainer = FSDPTrainer()
    trainer.step()  # a state that any restore would change
    trainers.append(trainer)
    return trainer


def rank_main(rank: int, world: int, init_file: str, job: dict[str, Any], out: str) -> None:
    """Pause once, then run every scenario; save ``result_<tag>_rank<r>.pt``.

    The result holds ``paused`` (the local state at the pause), ``resumed`` (a fresh
    trainer's local state after resuming it), one record per refusal scenario and
    ``full_disk`` (a pause whose shard writes fail on rank 1).
    """
    tag = job["tag"]
    _capture_stderr(Path(out, f"stderr_{tag}_rank{rank}.txt"))
    trainers: list[FSDPTrainer] = []
    try:
        join_group(rank, world, init_file)
        work = Path(job["directory"])
        pause = work / "pause"
        source = _fresh(trainers)
        while source.completed_steps < PAUSED_AT:
            source.step()
        source.pause(pause)
        result: dict[str, Any] = {"paused": _local(source.state())}

        resumed = _fresh(trainers)
        resumed.resume(pause)
        result["resumed"] = _local(resumed.state())

        for scenario in REFUSALS:
            copy = work / scenario
            marker = str(work / f"{scenario}.ran")
            undo = _prepare(scenario, pause, copy, marker)
            try:
                trainer = _fresh(trainers)
                result[scenario] = _refused(trainer, lambda t=trainer, c=copy: t.resume(c))
            finally:
                undo()
            dist.barrier()

        undo = _fail_shard_writes_on(1)
        try:
            writer = _fresh(trainers)
            result["full_disk"] = _refused(writer, lambda: writer.pause(pause))
            result["full_disk"]["paused"] = writer.paused
        finally:
            undo()
        dist.barrier()
        torch.save(result, Path(out, f"result_{tag}_rank{rank}.pt"))
        for trainer in trainers:
            trainer.loader.close()
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        Path(out, f"error_{tag}_rank{rank}.txt").write_text(traceback.format_exc())
        raise
