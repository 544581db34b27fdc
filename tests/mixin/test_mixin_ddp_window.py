"""A DDP accumulation window with unused-parameter detection resumes as the uninterrupted run.

The loop (support.ddp_window): windows of 4 micro-steps, the first three under
``no_sync()``; a branch ``b`` that each rank takes at one early position of a window and
that the window's synced backward never reaches. DDP(``find_unused_parameters=True``)
averages ``b``'s gradients only because its reducer recorded ``b`` as used under
``no_sync``; a pause carries that record per rank, and ``resume()`` gives it to the
fresh reducer. ``static_graph=True`` keeps no such record; a pause inside its window
resumes where the next micro-step syncs, and is refused (359) where it would start a
fresh static-graph DDP under ``no_sync``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support import ddp_window
from support.ddp_workers import describe_exits, launch

from trainer_resume.durable import load_checkpoint
from trainer_resume.testing import first_difference

ALL = ["a.weight", "a.bias", "b.weight", "b.bias", "c.weight", "c.bias"]


@pytest.mark.slow
def test_two_ranks_paused_mid_window_resume_in_a_new_process_group_as_the_uninterrupted_run(
    tmp_path: Path,
) -> None:
    codes = launch(2, {"tag": "window"}, tmp_path, main=ddp_window.rank_main)
    assert codes == [0, 0], describe_exits(codes, "window", tmp_path)
    ranks = load_checkpoint(tmp_path / "pause.ckpt")["distributed"]["ranks"]
    assert [rank["ddp_window"] for rank in ranks] == [
        {"model": {"static_graph": False, "used": ALL}}
    ] * 2
    without_record = []
    for rank in (0, 1):
        result = torch.load(tmp_path / f"result_window_rank{rank}.pt", weights_only=True)
        assert result["paused_at"] == ddp_window.PAUSE
        difference = first_difference(result["uninterrupted"], result["resumed"])
        assert difference is None, (rank, difference.describe())
        without_record.append(first_difference(result["uninterrupted"], result["without_record"]))
    # Without the record the branch's gradients stay each rank's own: the run differs.
    assert any(difference is not None for difference in without_record)
