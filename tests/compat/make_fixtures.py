"""Write the compatibility fixtures with whichever checkout of the library is imported.

``test_compat_files.py`` runs this script with the package as it was before its modules
moved into subpackages (commit 21f14a5, extracted by ``support.earlier_release``), so
that the current code is shown to resume that layout's files exactly. By hand:

    mkdir old && git archive 21f14a5 trainer_resume | tar -x -C old
    PYTHONPATH=old python tests/compat/make_fixtures.py /tmp/fixtures

The trainers come from ``trainers.py`` beside this script, loaded by its path, so the
script needs nothing of the tests and only the public names every layout has.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

import trainer_resume


def _load_trainers():
    # Registered under a fixed name before it runs: the spawned sharded ranks unpickle
    # their target by that name after re-running this script, which loads it again.
    spec = importlib.util.spec_from_file_location(
        "compat_trainers", Path(__file__).with_name("trainers.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


trainers = _load_trainers()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the fixtures directory (replaced)")
    args = parser.parse_args(argv)
    print(f"writing with {trainer_resume.__file__}")
    if args.out.exists():
        shutil.rmtree(args.out)
    (args.out / "single").mkdir(parents=True)
    trainers.write_single_pause(args.out / "single" / "pause.ckpt")
    trainers.write_resume_points(args.out / "points")
    (args.out / "lightning").mkdir()
    trainers.fit_lightning(args.out / "lightning", pause_at=trainers.PAUSE_STEP)
    with tempfile.TemporaryDirectory() as scratch:
        trainers.run_sharded_ranks("pause", args.out / "sharded", Path(scratch))
    for path in sorted(args.out.rglob("*")):
        if path.is_file():
            print(f"{path.relative_to(args.out)}  {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
