"""Integrations of trainer-resume with training frameworks.

Each integration lives in its own module and is imported explicitly, so that
``import trainer_resume`` never imports a framework: ``trainer_resume.adapters.lightning``
(PyTorch Lightning, the ``lightning`` extra) and ``trainer_resume.adapters.accelerate``
(Hugging Face Accelerate, the ``accelerate`` extra).
"""
