"""``python -m sharding_store``: the ``sharding-store`` command (for when the script is not on PATH)."""

from .cli import run

run()
