"""Resumable data loading."""
