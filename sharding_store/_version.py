"""This tool's version: what ``--version`` prints and a migration's commit message names
(setup.cfg installs the same; ``tests/unit/ops/test_migrate.py`` checks they agree)."""

__version__ = "0.1.0"
