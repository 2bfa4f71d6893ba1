"""What the tests share and that is not a test: tiny models built in code, configs of tiny runs,
the family cases, the jobs that ``accelerate launch`` runs, a local HTTP stub.

``tests/`` is on ``sys.path`` (``pythonpath`` in pyproject.toml's pytest section), so a test
module imports ``from helpers.tiny import tiny_sd3_pipeline``; no test module imports another
test module. A script run on its own (the ``*_job.py`` files, a benchmark) puts ``tests/`` on
``sys.path`` itself.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root folder (``configs/``, ``scripts/`` and the packages live there)."""

ASSETS = ROOT / "tests" / "assets"
"""Files the tests read: the golden metrics rows, the speech clips."""
