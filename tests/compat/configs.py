"""Configs without launch values (no ``${hydra:...}``, no ``${now:...}``), for the test that
their signatures, and the pause files signed with them, are those of an earlier release.

Loaded by its path under the module name ``compat_configs`` both by the earlier release's
script and by the test (:func:`load`), so that the enum and dataclass types below have
the same qualified names, which their canonical forms hold. Imports nothing of the
package.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
import math
import sys
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

import torch
from omegaconf import OmegaConf

ENV = {"COMPAT_DATA": "/data/compat"}
NAME = "compat_configs"


def load() -> ModuleType:
    """This module under its fixed name (loaded once per process)."""
    if NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(NAME, Path(__file__))
        module = importlib.util.module_from_spec(spec)
        sys.modules[NAME] = module
        spec.loader.exec_module(module)
    return sys.modules[NAME]


class Activation(enum.Enum):
    RELU = "relu"
    GELU = "gelu"


@dataclasses.dataclass
class Optim:
    lr: float = 0.05
    betas: tuple = (0.9, 0.99)
    activation: Activation = Activation.GELU


@dataclasses.dataclass
class Structured:
    seed: int = 3
    optim: Optim = dataclasses.field(default_factory=Optim)
    data: str = "${oc.env:COMPAT_DATA}/train"
    load: str = "runs/pause.ckpt"


def configs() -> dict[str, Any]:
    """Name -> config, built anew (``ENV`` must be set)."""
    return {
        "plain": {
            "seed": 3,
            "model": {"layers": [{"act": "relu", "width": 8}, {"act": "gelu", "width": 4}]},
            "numbers": [1, 1.0, True, None, -0.0, math.inf, -math.inf, math.nan, 0.1],
            "path": PurePosixPath("runs/a"),
            "activation": Activation.RELU,
            "dtype": torch.bfloat16,
            "device": torch.device("cpu"),
            "generator": torch.Generator().manual_seed(5),
            "optim": Optim(),
            "pair": (1, "two"),
            "odd keys": {"a.b": 1, "": 2},
            "load": "runs/pause.ckpt",
        },
        "omegaconf": OmegaConf.create(
            {
                "seed": 3,
                "lr": 0.05,
                "optim": {"lr": "${lr}", "name": "adamw-${lr}", "betas": [0.9, "${..lr}"]},
                "paths": {
                    "data": "${oc.env:COMPAT_DATA}",
                    "cache": "${oc.env:COMPAT_NOT_SET,/tmp}",
                },
                "run_dirs": ["out", "${run_dirs[0]}/ckpt"],
                "model": OmegaConf.structured(Optim),
                "load": "???",
            }
        ),
        "structured": OmegaConf.structured(Structured),
        "dataclass": Structured(),
        "lightning_example": OmegaConf.load(
            Path(__file__).resolve().parents[2] / "configs" / "lightning_example.yaml"
        ),
    }


def with_hydra_node() -> Any:
    """A config with a top-level ``hydra`` node of plain values (as ``compose(...,
    return_hydra_config=True)`` can give): an earlier release signed that node."""
    return OmegaConf.create(
        {"seed": 3, "optim": {"lr": 0.05}, "hydra": {"job": {"name": "train", "num": 0}}}
    )
