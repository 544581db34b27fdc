"""Which loads of a checkpoint file fell back to copying its payload whole."""

from __future__ import annotations

from typing import Any

import pytest

import trainer_resume.durable as durable


def record_whole_copies(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A list that gets ``"whole-copy"`` for each load that copies the payload whole
    (``durable.load_payload``) instead of reading it record by record."""
    taken: list[str] = []
    real = durable.load_payload

    def load_payload(*args: Any) -> Any:
        taken.append("whole-copy")
        return real(*args)

    monkeypatch.setattr(durable, "load_payload", load_payload)
    return taken
