"""The README is what a newcomer runs first: its links resolve, it opens with the two
commands and the three steps, and the three steps' block runs as printed (issue 27 item 16)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _sections(text: str) -> list[str]:
    return re.findall(r"^## (.+)$", text, flags=re.M)


def test_readme_opens_with_the_two_commands_then_the_three_steps():
    sections = _sections(README.read_text())
    assert sections[:3] == ["Two commands", "Migrate your store in three steps", "Install"], sections


def test_readme_is_short_and_the_reference_lives_in_docs():
    text = README.read_text()
    assert len(text.splitlines()) < 200, "reference detail belongs in docs/, linked from the README"
    for heading in ("Security and trust notes", "Generations", "Tests"):
        assert f"## {heading}" not in text, heading


def test_every_relative_link_of_the_readme_and_docs_resolves():
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken
    assert len(pages) > 5  # the docs pages are there


def _three_steps() -> list[str]:
    text = README.read_text()
    block = text.split("## Migrate your store in three steps", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_the_three_steps_are_info_migrate_open():
    steps = _three_steps()
    assert [s.split()[:2] for s in steps] == [["sharding-store", "info"], ["sharding-store", "migrate"],
                                              ["python", "-c"]], steps


@pytest.mark.slow
def test_the_three_steps_run_as_printed(tmp_path):
    """Each line of the block, run in a shell from the repository root with the output
    path moved into a temporary folder: exit 0, and step 3 prints the array's values."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    outputs = []
    for step in _three_steps():
        step = step.replace("/tmp/sample.zarr", str(tmp_path / "sample.zarr"))
        if step.startswith("python "):
            step = shlex.quote(sys.executable) + step[len("python"):]
        got = subprocess.run(step, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert got.returncode == 0, (step, got.stdout, got.stderr)
        outputs.append(got.stdout)
    assert "draft-era Zarr v3" in outputs[0]
    assert (tmp_path / "sample.zarr" / "zarr.json").exists()
    assert re.search(r"\[\[\s*\d+", outputs[2]), outputs[2]  # a 2 x 4 slice of numbers
