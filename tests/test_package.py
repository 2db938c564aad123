"""The package namespace (lazy public names) and the ``sharding-store`` process."""

from __future__ import annotations

import pytest


def test_package_exports_load_on_first_use_and_functions_win_over_submodules():
    """``import sharding_store`` loads none of the heavy modules; every public name
    resolves; ``sharding_store.migrate`` stays the function after its submodule loads."""
    import subprocess
    import sys

    code = (
        "import sys, sharding_store as s\n"
        "heavy = [m for m in ('numpy', 'numcodecs', 'zarr', 'fsspec') if m in sys.modules]\n"
        "import sharding_store.ops.migration, sharding_store.ops.verification, sharding_store.ops.resharding\n"
        "from sharding_store import migrate, verify, reshard\n"
        "ok = all(callable(f) and f.__module__ == 'sharding_store.' + s._EXPORTS[f.__name__]"
        "         for f in (s.migrate, s.verify, s.reshard, migrate))\n"
        "missing = [n for n in s.__all__ if getattr(s, n, None) is None]\n"
        "print(heavy, ok, missing, 'zarr' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")[0]
    assert out == "[] True [] True"  # open_v3 (in __all__) imports zarr only when asked for


def test_cli_starts_numpy_with_one_blas_thread_unless_the_user_chose():
    """A BLAS pool is a core-wide spin on small machines and no command uses it: a fresh
    CLI process runs numpy's OpenBLAS with one thread; a user's own setting stays."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    sample = str(Path(__file__).resolve().parents[1] / "samples" / "zarr-2.18-sharded.zr3")
    code = (
        "import os, sys\n"
        "from sharding_store.cli import main\n"
        f"rc = main(['info', {sample!r}])\n"
        "tasks = len(os.listdir('/proc/self/task')) if os.path.isdir('/proc/self/task') else -1\n"
        "print(rc, os.environ.get('OPENBLAS_NUM_THREADS'), tasks, 'numpy' in sys.modules)\n"
    )

    def run(**env: str) -> list[str]:
        base = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**base, **env}).stdout
        return out.strip().splitlines()[-1].split()

    ours, users = run(), run(OPENBLAS_NUM_THREADS="2")
    assert ours[:2] == ["0", "1"] and users[:2] == ["0", "2"] and ours[3] == users[3] == "True"
    if ours[2] != "-1":  # Linux: the user's 2 BLAS threads exist, ours do not
        assert int(ours[2]) < int(users[2])


def test_executable_flushes_everything_and_keeps_exit_codes_without_interpreter_teardown():
    """``cli.run`` leaves with ``os._exit``: all output must still arrive, error codes
    stay, and a reader that leaves early gets the broken-pipe code, not a traceback."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from sharding_store.cli import EXIT_BROKEN_PIPE
    from sharding_store.errors import StoreNotFoundError

    cli = [sys.executable, "-m", "sharding_store.cli"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # output waits in buffers
    sample = str(Path(__file__).resolve().parents[1] / "samples" / "zarr-2.18-sharded.zr3")
    ok = subprocess.run([*cli, "info", "--json", sample], capture_output=True, text=True, env=env)
    assert ok.returncode == 0 and json.loads(ok.stdout)["arrays"], ok.stderr
    bad = subprocess.run([*cli, "info", sample + "-missing"], capture_output=True, text=True, env=env)
    assert bad.returncode == StoreNotFoundError.exit_code and len(bad.stderr.splitlines()) == 1
    proc = subprocess.Popen([*cli, "ls", sample], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # gone long before the child has started up and printed
    err = proc.stderr.read().decode()
    assert proc.wait() == EXIT_BROKEN_PIPE and "Traceback" not in err and "Exception ignored" not in err, err


def test_setup_cfg_declares_each_option_once():
    """pip refuses a setup.cfg with an option given twice (two helpers once both added the
    ``icechunk`` extra): read it as setuptools does, strictly."""
    import configparser
    from pathlib import Path

    parser = configparser.ConfigParser(strict=True, interpolation=None)
    parser.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    extras = parser["options.extras_require"]
    assert {"s3", "dask", "xarray", "icechunk", "test"} <= set(extras)
    assert "icechunk" in extras["test"], "CI installs only the test extra: it must hold icechunk"


def _make_pytest_commands(target: str) -> list[list[str]]:
    """The pytest command lines ``make <target>`` would run, as ``make -n`` prints them."""
    import shlex
    import shutil
    import subprocess
    from pathlib import Path

    import pytest

    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    root = Path(__file__).resolve().parents[1]
    # -n: the recipes (the install step's too) are printed, never run
    out = subprocess.run(["make", "-n", "-C", str(root), target], capture_output=True, text=True, check=True)
    return [words for words in map(shlex.split, out.stdout.splitlines()) if words[1:3] == ["-m", "pytest"]]


def test_the_slow_marker_is_registered_and_checked_strictly(pytestconfig):
    """``slow`` is declared (``make check`` deselects it) and a misspelled marker is an error,
    not a test that silently stays in (or leaves) the fast loop."""
    markers = pytestconfig.getini("markers")
    assert any(m.split(":")[0].strip() == "slow" for m in markers), markers
    assert "--strict-markers" in pytestconfig.getini("addopts")


def test_make_check_leaves_out_the_slow_tests_and_make_test_runs_them_all():
    """``make check`` is the fast loop: one pytest run without the ``slow`` tests. ``make test``
    (what CI runs, ``.ci/run``) selects nothing by marker or name: the slow tests still run."""
    from pathlib import Path

    check = _make_pytest_commands("check")
    assert len(check) == 1, check
    assert check[0][check[0].index("-m", 3) + 1] == "not slow", check
    full = _make_pytest_commands("test")
    assert full, "make test runs no pytest"
    for words in full:
        assert "-m" not in words[3:] and "-k" not in words and not any(w.startswith(("-m=", "-k=", "--deselect")) for w in words), words
    ci = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text().splitlines()
    assert "make test" in [line.strip() for line in ci], ci


def test_make_demo_installs_the_package_alone():
    """``make demo`` installs what the demo runs, the package without extras (issue 27 item 3:
    the test extras made an 818 MB venv in 78 s for a 2 MiB demo); ``make test`` the rest."""
    import shlex
    import shutil
    import subprocess
    from pathlib import Path

    import pytest

    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    root = Path(__file__).resolve().parents[1]
    # -B: as from a fresh clone (every install step is due); -n: printed, never run
    demo = subprocess.run(["make", "-Bn", "-C", str(root), "demo"], capture_output=True, text=True, check=True).stdout
    installs = [shlex.split(line.split(">")[0]) for line in demo.splitlines() if " pip install" in line]
    assert installs and all(words[-1] == "." for words in installs), installs
    assert "[test" not in demo and "[bench" not in demo, demo
    full = subprocess.run(["make", "-Bn", "-C", str(root), "test"], capture_output=True, text=True, check=True).stdout
    assert "'.[test,bench]'" in full


@pytest.mark.slow
def test_make_demo_prints_only_the_demos_output(tmp_path):
    """The demo's recipe echoes no command line: what it prints is its own output (an
    installed venv is stood in for by one that runs this checkout)."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    root = Path(__file__).resolve().parents[1]
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for name, run in (("python", ""), ("sharding-store", " -m sharding_store")):  # this interpreter, its venv
        script = venv / "bin" / name
        script.write_text(f"#!/bin/sh\nexec {sys.executable}{run} \"$@\"\n")
        script.chmod(0o755)
    for stamp in (".installed-base", ".installed"):  # installed: make has nothing to install
        (venv / stamp).touch()
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run(["make", "--no-print-directory", "-C", str(root), "demo", f"VENV={venv}", f"OUT={tmp_path / 'out.zarr'}"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("== what is in the sample")
    echoed = [line for line in lines if line.startswith((str(venv), "echo ", "make"))]
    assert not echoed, echoed
    assert any(line.startswith("migrated ") for line in lines) and any("equal to source" in line for line in lines)
