"""``python -m trainer_resume``: the same as the ``trainer-resume`` command."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
