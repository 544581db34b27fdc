"""A fresh process in which Accelerate reports a release newer than the adapter's tested ones.

``python -m support.newer_release VERSION RESULTS`` sets ``accelerate.__version__`` to
VERSION before the adapter is imported, imports it (recording the release warnings it
gives), then trains the Accelerate loop uninterrupted, and again paused inside an
accumulation window and resumed by a fresh trainer, and saves both runs to RESULTS.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import accelerate
import torch

from trainer_resume import UntestedReleaseWarning

PAUSE_AT = 6  # micro-steps: inside the second window of 4


def main(version: str, results: str) -> None:
    accelerate.__version__ = version
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from support.accelerate_loop import (
            AccelerateLoop,
            final_states,
            fresh_accelerate_state,
            train,
        )
    given = [str(item.message) for item in caught if item.category is UntestedReleaseWarning]

    fresh_accelerate_state()
    reference = AccelerateLoop(workers=0)
    expected = train(reference)["losses"]
    expected_states = final_states(reference)

    fresh_accelerate_state()
    paused = AccelerateLoop(workers=0)
    batches = iter(paused.loader)
    losses = [paused.step(next(batches)) for _ in range(PAUSE_AT)]
    pause = Path(results).with_suffix(".pause")
    paused.pause(pause)
    fresh_accelerate_state()
    resumed = AccelerateLoop(workers=0)
    resumed.resume(pause)
    losses += train(resumed)["losses"]
    torch.save(
        {
            "warnings": given,
            "expected": {"losses": expected, "states": expected_states},
            "resumed": {"losses": losses, "states": final_states(resumed)},
        },
        results,
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
