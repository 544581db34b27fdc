"""MosaicML's ``StreamingDataset`` through ``ResumableDataLoader``, with the real library:
shuffled, randomly augmented, 0 and 2 workers, interrupted after 3 batches and at an
epoch's end, resumed in a new process, every batch equal to the uninterrupted run's.

mosaicml-streaming cannot be installed beside the test extra (it requires
``transformers<5`` and ``numpy<2.2``, and imports ``torchvision``, whose PyPI builds do
not import beside the CPU torch), so CI does not have it and skips this module; it
runs wherever the package imports. What CI checks of MosaicML's published state
format is in test_streaming_mosaicml_format.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streaming", reason="mosaicml-streaming is not in the test extra")

from support import mosaic_runs  # noqa: E402
from support.streaming_runs import check_resumes_in_new_process  # noqa: E402


@pytest.mark.slow
def test_mosaicml_stream_resumes_exactly_in_a_new_process(tmp_path: Path) -> None:
    folder = str(tmp_path / "data")
    mosaic_runs.write_dataset(folder)
    check_resumes_in_new_process(mosaic_runs, folder, tmp_path)
