"""Integrations of trainer-resume with training frameworks."""
