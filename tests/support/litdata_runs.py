"""litdata's ``StreamingDataset``, randomly augmented, through ``ResumableDataLoader``.

The dataset is written with litdata's own writer (``litdata.streaming.Cache``) in
chunks of 16 samples. Run as a script, ``python -m support.litdata_runs DATA STATES OUT``
resumes each saved state in this new process (see ``support.streaming_runs``).
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import torch

# litdata asks PyPI for a newer release when a dataset is built (0.2.76 not when told so).
os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")
warnings.filterwarnings("ignore", message="A newer version of litdata")

import litdata.streaming.dataset  # noqa: E402
from litdata import StreamingDataset  # noqa: E402
from litdata.streaming import Cache  # noqa: E402

# 0.2.44 has no switch: its check (an HTTP request with a 30 s timeout) is replaced, so
# no test waits on the network.
litdata.streaming.dataset._check_version_and_prompt_upgrade = lambda version: None

from support.streaming_runs import SAMPLES, augment, resumable_loader, resume_main  # noqa: E402
from trainer_resume.loaders import ResumableDataLoader  # noqa: E402


class AugmentedStream(StreamingDataset):
    """litdata's dataset with a random augmentation of every sample."""

    def __getitem__(self, index: Any) -> dict[str, Any]:
        item = super().__getitem__(index)
        return {"id": item["id"], "x": augment(item["x"])}


def write_dataset(folder: str) -> None:
    cache = Cache(folder, chunk_size=16)
    for index in range(SAMPLES):
        cache[index] = {"id": index, "x": torch.full((3,), float(index))}
    cache.done()
    cache.merge()


def make_loader(folder: str, workers: int) -> ResumableDataLoader:
    return resumable_loader(AugmentedStream(folder, shuffle=True), workers)


if __name__ == "__main__":
    resume_main(make_loader, sys.argv[1:4])
