"""The same resume on a GPU pipeline: file reading on the CPU, augmentation on the GPU.

Skipped where there is no CUDA device (CI has none); run it where one is lent.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip(
    "nvidia.dali.plugin.pytorch",
    reason="NVIDIA DALI cannot be imported here (pip install 'trainer-resume[dali]')",
)
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the GPU pipeline tests need one", allow_module_level=True)

import nvidia.dali.fn as fn  # noqa: E402
import nvidia.dali.types as types  # noqa: E402
from nvidia.dali import pipeline_def  # noqa: E402
from support import dali_runs  # noqa: E402

from trainer_resume.adapters.dali import ResumableDALIIterator  # noqa: E402


@pipeline_def(batch_size=dali_runs.BATCH_SIZE, num_threads=1, device_id=0, seed=5)
def gpu_pipeline(root):
    raw, labels = fn.readers.file(
        file_root=root, file_filters=["*.bin"], random_shuffle=True, initial_fill=8, name="Reader"
    )
    images = fn.reinterpret(
        raw, dtype=types.UINT8, shape=[dali_runs.SIDE, dali_runs.SIDE, 3], layout="HWC"
    )
    images = fn.crop_mirror_normalize(
        images.gpu(), mirror=fn.random.coin_flip(), dtype=types.FLOAT, mean=[0.0], std=[255.0]
    )
    noise = fn.random.normal(images, stddev=0.05, device="gpu")  # a GPU random operator
    return images + noise, labels.gpu()


def _iterator(root):
    return ResumableDALIIterator(
        gpu_pipeline,
        ["images", "labels"],
        pipeline_kwargs={"root": root, "enable_checkpointing": True},
        reader_name="Reader",
    )


def test_a_gpu_pipeline_resumes_after_any_batch_with_cuda_batches(tmp_path):
    root = dali_runs.write_images(tmp_path)
    iterator = _iterator(root)
    states, seen = [iterator.state_dict()], []
    for epoch in range(iterator.epoch, dali_runs.EPOCHS):
        for batch in iterator:
            assert batch[0]["images"].is_cuda and batch[0]["labels"].is_cuda
            seen.append((epoch, batch[0]))
            states.append(iterator.state_dict())
    for k, state in enumerate(states[:-1]):
        resumed = _iterator(root)
        resumed.load_state_dict(state)
        assert resumed.epoch == seen[k][0]
        got = [
            (epoch, batch[0])
            for epoch in range(resumed.epoch, dali_runs.EPOCHS)
            for batch in resumed
        ]
        assert len(got) == len(seen) - k, f"after {k} batches"
        for (epoch_a, a), (epoch_b, b) in zip(seen[k:], got):
            assert epoch_a == epoch_b
            assert all(torch.equal(a[name], b[name]) for name in a), f"after {k} batches"
