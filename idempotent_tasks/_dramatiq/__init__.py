"""Internals of :mod:`idempotent_tasks.dramatiq` (the public names live there)."""
