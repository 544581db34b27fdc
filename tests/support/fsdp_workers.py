"""Ranks of a small FSDP2 (``fully_shard``) training run on CPU with gloo, for the sharded tests.

Module level on purpose: the ranks find its functions by name. The data, loader and
seeds are those of the DDP runs (``support.ddp_workers``); only the model is sharded.
"""

from __future__ import annotations

import os
import signal
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from support.ddp_workers import RankTrainer, _capture_stderr, join_group
from trainer_resume.distributed import WorldSizeChangeWarning
from trainer_resume.errors import ResumeError
from trainer_resume.mixin import training_step
from trainer_resume.rng import random_state
from trainer_resume.testing import first_difference


class FSDPTrainer(RankTrainer):
    """The shared rank trainer with its Linears sharded by ``fully_shard`` over all ranks."""

    def _distribute(self, module: nn.Module) -> nn.Module:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in module:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(module, mesh=mesh)
        return module

    def state(self) -> dict[str, Any]:
        """Everything a resume restores, as live objects (DTensors included)."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "loader": self.loader.state_dict(),
            "extra": dict(self.extra),
            "steps": self.completed_steps,
            "rng": random_state(),
        }


class WindowFSDPTrainer(FSDPTrainer):
    """Two micro-batches per optimizer step; gradients None at window ends. With
    ``sync=False`` the first micro-batch keeps FSDP2 from reduce-scattering."""

    sync = True

    @training_step
    def step(self) -> None:
        x, y, _ = next(self.iterator)
        last = self.completed_steps % 2 == 1
        self.model.set_requires_gradient_sync(self.sync or last)
        (nn.functional.mse_loss(self.model(x), y) / 2).backward()
        if last:
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)


class CheckpointedTrainer(FSDPTrainer):
    """Each Linear wrapped as torchtitan wraps a block: ``checkpoint_wrapper``, then (in
    :class:`CompiledTrainer`) ``torch.compile`` replacing it, then ``fully_shard``."""

    compile_blocks = False

    def _distribute(self, module: nn.Module) -> nn.Module:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for index, layer in enumerate(module):
            if isinstance(layer, nn.Linear):
                block = checkpoint_wrapper(layer)
                if self.compile_blocks:
                    block = torch.compile(block)
                fully_shard(block, mesh=mesh)
                module[index] = block
        fully_shard(module, mesh=mesh)
        return module


class CompiledTrainer(CheckpointedTrainer):
    compile_blocks = True


def _local(value: Any) -> Any:
    """This rank's shard of a DTensor (a plain tensor as it is), cloned; containers walked."""
    if isinstance(value, DTensor):
        return value.to_local().detach().clone()
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: _local(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_local(item) for item in value]
    return value


def by_parameter_order(trainer: FSDPTrainer) -> dict[str, Any]:
    """This rank's shards of the weights and gradients by parameter order (which no wrapper
    changes, unlike the names), the optimizer state (keyed by that order) and the rest of
    the trainer's state, copied."""
    params = list(trainer.model.parameters())
    return _local(
        {
            "weights": list(params),
            "gradients": [p.grad for p in params],
            "optimizer": trainer.optimizer.state_dict(),
            "scheduler": trainer.scheduler.state_dict(),
            "loader": trainer.loader.state_dict(),
            "steps": trainer.completed_steps,
            "rng": random_state(),
        }
    )


def _full(value: Any) -> Any:
    """The whole tensor of a DTensor, gathered from every rank (a collective: all ranks call it)."""
    if isinstance(value, DTensor):
        return value.full_tensor().detach().clone()
    if isinstance(value, dict):
        return {key: _full(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_full(item) for item in value]
    return _local(value)


def _kill_at_replace(trainer: FSDPTrainer, step: int) -> None:
    """This rank dies in the durable write of its rank file, in the pause at ``step``."""
    real = os.replace

    def dying_replace(*args: Any, **kwargs: Any) -> Any:
        if trainer.completed_steps == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    os.replace = dying_replace


def rank_main(rank: int, world: int, init_file: str, job: dict[str, Any], out: str) -> None:
    """One rank: optionally resume, run steps, honour pause requests, save the result.

    ``job`` keys: ``tag``; ``steps`` (run until ``completed_steps`` reaches it) or
    ``more`` (steps after resuming); ``resume`` (pause directory); ``requests``
    ({step: [pause directory, requesting rank]}); ``continue_after_pause`` (resume
    the pause in-process and go on); ``kill`` ([rank, step]: that rank dies writing
    its rank file in the pause at that step); ``snapshot_at`` (a step after which the
    gathered full state is recorded); ``refusal`` (the resume is expected to raise:
    record the error and whether any local state changed); ``trainer`` (``"window"``:
    two micro-batches per optimizer step).
    """
    tag = job["tag"]
    _capture_stderr(Path(out, f"stderr_{tag}_rank{rank}.txt"))
    try:
        join_group(rank, world, init_file)
        trainer = WindowFSDPTrainer() if job.get("trainer") == "window" else FSDPTrainer()
        kill = job.get("kill")
        if kill is not None and kill[0] == rank:
            _kill_at_replace(trainer, kill[1])
        result: dict[str, Any] = {}
        if job.get("refusal"):
            trainer.step()  # a state that any restore would change
            before = _local(trainer.state())
            try:
                trainer.resume(job["resume"])
            except ResumeError as error:
                result["error"] = f"{type(error).__name__}: {error}"
            result["unchanged"] = first_difference(before, _local(trainer.state())) is None
            result["locked"] = trainer.locked
        else:
            caught: list[str] = []
            if job.get("resume"):
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always", WorldSizeChangeWarning)
                    trainer.resume(job["resume"])
                caught = [
                    str(w.message) for w in seen if issubclass(w.category, WorldSizeChangeWarning)
                ]
                result["resumed_steps"] = trainer.completed_steps
                result["resumed_full"] = _full(trainer.state())
            target = job["steps"] if "steps" in job else trainer.completed_steps + job["more"]
            requests = {int(step): value for step, value in job.get("requests", {}).items()}
            paused_at = []
            while trainer.completed_steps < target:
                request = requests.get(trainer.completed_steps + 1)
                if request is not None and request[1] == rank:
                    trainer.request_pause(request[0])
                trainer.step()
                if trainer.completed_steps == job.get("snapshot_at"):
                    result["snapshot"] = _full(trainer.state())
                if trainer.paused:
                    paused_at.append(trainer.completed_steps)
                    if job.get("continue_after_pause"):
                        trainer.resume(requests[trainer.completed_steps][0])
                        continue
                    break
            result.update(
                local=_local(trainer.state()),
                full=_full(trainer.state()),
                batches=trainer.batches,
                ids=[ids.tolist() for _, _, ids in trainer.batches],
                completed_steps=trainer.completed_steps,
                paused_at=paused_at,
                warnings=caught,
                scheduler_last_epoch=trainer.scheduler.last_epoch,
            )
        torch.save(result, Path(out, f"result_{tag}_rank{rank}.pt"))
        trainer.loader.close()
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        Path(out, f"error_{tag}_rank{rank}.txt").write_text(traceback.format_exc())
        raise
