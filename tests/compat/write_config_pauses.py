"""Write, with whichever checkout of the library is imported, the signatures of the configs
of ``configs.py`` and pause files signed with them.

``test_config_signatures.py`` runs this script with the package as it was before launch
values and ``config_ignore`` (commit 158d509, extracted by ``support.earlier_release``):

    mkdir old && git archive 158d509 trainer_resume | tar -x -C old
    PYTHONPATH=old python tests/compat/write_config_pauses.py /tmp/out

Writes ``signatures.json`` (of ``configs()`` and ``with_hydra_node()``), ``mixin.ckpt``
(the ``omegaconf`` config), ``hydra_node.ckpt`` (a config with a top-level ``hydra``
node) and ``lightning/pause.ckpt`` (the ``omegaconf`` config).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

import trainer_resume

HERE = Path(__file__).resolve().parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    print(f"writing with {trainer_resume.__file__}")
    configs = _load("compat_configs", HERE / "configs.py")
    trainers = _load("compat_trainers", HERE / "trainers.py")
    os.environ.update(configs.ENV)
    args.out.mkdir(parents=True, exist_ok=True)
    signatures = {
        name: trainer_resume.config_signature(config) for name, config in configs.configs().items()
    }
    signatures["with_hydra_node"] = trainer_resume.config_signature(configs.with_hydra_node())
    (args.out / "signatures.json").write_text(json.dumps(signatures, indent=1))
    trainers.write_single_pause(args.out / "mixin.ckpt", config=configs.configs()["omegaconf"])
    trainers.write_single_pause(args.out / "hydra_node.ckpt", config=configs.with_hydra_node())
    (args.out / "lightning").mkdir(exist_ok=True)
    trainers.fit_lightning(
        args.out / "lightning", pause_at=trainers.PAUSE_STEP, config=configs.configs()["omegaconf"]
    )


if __name__ == "__main__":
    main()
