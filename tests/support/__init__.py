"""Helpers shared by the tests: trainers, loader streams, checkpoint makers and the child
processes the multi-process tests start, imported as ``support.<module>`` (pytest puts
tests/ on ``sys.path``; a child process gets it on its ``PYTHONPATH`` or from spawn)."""
