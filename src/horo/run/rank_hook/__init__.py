"""Per-rank hook that hororun puts on every rank's ``PYTHONPATH`` (see ``sitecustomize.py`` here).

This directory is added to ``PYTHONPATH`` as a path entry, not imported as a package: Python then runs its
``sitecustomize`` module at start-up in every Python process of the job.
"""

__all__: list[str] = []
