"""Hydra apps laid out like the Lightning + Hydra template, launched by the tests as a
user launches them (``python <app>.py [overrides]``, ``-m`` for a sweep): one with the
mixin (``mixin_app.py``), one with the Lightning adapter (``lightning_app.py``), sharing
the config folder ``configs/`` and the pieces in ``common.py``."""
