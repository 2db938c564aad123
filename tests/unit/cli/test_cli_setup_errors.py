"""Setup and configuration errors are not bugs (issue 12 item 11): one line on stderr,
exit 2 (usage: unknown protocol, missing backend, bad storage options) or 12 (I/O:
unreachable endpoint, no space, permission denied), never a traceback nor exit 70, and
no "run again with --resume" when running again cannot help.

A final Zarr v3 or a Zarr v2 store given where a draft-era one is expected says what it
is (exit 7) in every command instead of "invalid metadata": the generation is read from
the root documents (``hierarchy.detect_generation``).
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr

from sharding_store import create_draft_array, open_draft
from sharding_store.api.v3view import open_v3
from sharding_store.cli import main
from sharding_store.errors import StoreNotFoundError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
CLI = [sys.executable, "-m", "sharding_store.cli"]


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def one_line(code: int, err: str, expected: int, *fragments: str) -> str:
    assert "Traceback" not in err and "internal error" not in err, err
    assert code == expected, (code, err)
    (line,) = err.strip().splitlines()
    assert line.startswith("sharding-store: ") and all(f in line for f in fragments), line
    return line


def closed_port() -> int:
    """A local TCP port nobody listens on (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def draft(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("setup") / "src.zr3"
    create_draft_array(str(root), "a", shape=(8,), chunks=(2,), dtype="<i4", chunks_per_shard=(2,))[...] = np.arange(8)
    return root


# --------------------------------------------------------------------------- usage and I/O errors


@pytest.mark.parametrize("command", ["info", "migrate"])
def test_unknown_protocol_is_a_usage_error(command, draft):
    args = ["info", "nosuch://bucket/x"] if command == "info" else ["migrate", str(draft), "nosuch://bucket/x"]
    one_line(*run(*args)[::2], 2, "nosuch")


def test_bad_storage_options_are_usage_errors(draft):
    one_line(*run("info", str(draft), "--storage-options", "{bad")[::2], 2, "--storage-options", "JSON")
    one_line(*run("info", str(draft), "--storage-options", "[1, 2]")[::2], 2, "--storage-options", "object")
    pytest.importorskip("s3fs")
    port = closed_port()
    options = json.dumps({"nosuch_option": 1, "anon": True, "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}})
    one_line(*run("info", "s3://bucket/x", "--storage-options", options)[::2], 2, "nosuch_option")


@pytest.mark.slow  # child processes waiting on refused connections (~4 s)
def test_unreachable_endpoints_are_io_errors():
    port = closed_port()
    one_line(*run("info", f"http://127.0.0.1:{port}/store")[::2], 12, f"127.0.0.1:{port}")
    pytest.importorskip("s3fs")
    options = json.dumps({"anon": True, "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}})
    one_line(*run("info", "s3://bucket/x", "--storage-options", options)[::2], 12, "s3://bucket/x")


@pytest.mark.slow  # child processes
def test_missing_backend_names_the_extra_to_install(draft, tmp_path):
    """``s3://`` without s3fs installed (simulated in a child process: the import fails)."""
    code = textwrap.dedent("""
        import sys
        sys.modules["s3fs"] = None  # as if s3fs were not installed
        from sharding_store.cli import main
        sys.exit(main(sys.argv[1:]))
    """)
    for args in (["info", "s3://bucket/x"], ["migrate", str(draft), "s3://bucket/out"]):
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
        one_line(proc.returncode, proc.stderr, 2, "sharding-store[s3]")


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES], ids=["ENOSPC", "EACCES"])
def test_permanent_os_errors_exit_12_without_resume_advice(draft, monkeypatch, code):
    """The destination's backend fails every write with an error a retry cannot fix."""
    from fsspec.implementations.memory import MemoryFileSystem

    def fail(self, path, *args, **kwargs):
        raise OSError(code, os.strerror(code), path)

    monkeypatch.setattr(MemoryFileSystem, "pipe_file", fail)
    line = one_line(*run("migrate", str(draft), f"memory://setup-errors-{code}/dst")[::2], 12, os.strerror(code))
    assert "--resume" not in line


@pytest.mark.parametrize("error", [KeyError("boom"), ZeroDivisionError("a bug")], ids=["KeyError", "ZeroDivisionError"])
def test_json_answers_every_failure_even_a_bug(draft, monkeypatch, error):
    """``--json`` prints its one document for an error that is no class of ours too (a bug
    here, exit 70): it printed nothing on stdout, so a script reading it got no JSON."""
    import sharding_store.cli.info as info_cli

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(info_cli, "_info_destination", fail)
    exit_code, out, err = run("info", str(draft), "--json")
    doc = json.loads(out)
    assert exit_code == 70 and doc["ok"] is False and doc["exit_code"] == 70 and doc["command"] == "info"
    assert doc["error"]["class"] == type(error).__name__ and doc["schema"] == "sharding-store/1"
    assert len(err.strip().splitlines()) == 1 and doc["error"]["message"] in err


def test_error_policy_classes():
    """The policy itself: our errors keep their code, OSError and backend errors are I/O."""
    from sharding_store.cli import exit_status

    assert exit_status(StoreNotFoundError("x: gone"))[0] == 7
    assert exit_status(OSError(errno.ECONNREFUSED, "Connection refused"))[0] == 12
    assert exit_status(ValueError("a bug"))[0] == 70
    botocore = pytest.importorskip("botocore.exceptions")
    code, line = exit_status(botocore.NoCredentialsError())
    assert code == 12 and "NoCredentialsError" in line


# --------------------------------------------------------------------------- generations


@pytest.fixture(scope="module")
def other_generations(tmp_path_factory, draft) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("generations")
    v3 = root / "final.zarr"
    g = zarr.open_group(str(v3), mode="w", zarr_format=3)
    g.create_array("x", shape=(4,), dtype="i4")[...] = np.arange(4)
    v2 = root / "v2.zarr"
    g2 = zarr.open_group(str(v2), mode="w", zarr_format=2)
    g2.create_array("x", shape=(4,), dtype="i4")[...] = np.arange(4)
    v3_array = root / "final-array.zarr"
    zarr.create_array(str(v3_array), shape=(3,), dtype="u1")
    migrated = root / "migrated.zarr"
    code, _, err = run("migrate", str(draft), str(migrated))
    assert code == 0, err
    return {"v3": v3, "v3_array": v3_array, "v2": v2, "migrated": migrated}


def test_detect_generation(other_generations, draft, tmp_path):
    from sharding_store.api.hierarchy import Generation, detect_generation
    from sharding_store.stores import as_inner

    assert detect_generation(as_inner(str(draft)))[0] is Generation.DRAFT_2022
    assert detect_generation(as_inner(str(other_generations["v3"])))[0] is Generation.FINAL_V3
    assert detect_generation(as_inner(str(other_generations["v3_array"])))[0] is Generation.FINAL_V3
    assert detect_generation(as_inner(str(other_generations["v2"]))) == (Generation.ZARR_V2, ".zgroup")
    assert detect_generation(as_inner(str(tmp_path / "missing")))[0] is Generation.NONE
    assert detect_generation(as_inner({"zarr.json": b'{"zarr_format": 4}'}))[0] is Generation.UNKNOWN
    assert detect_generation(as_inner({"zarr.json": b"not json"}))[0] is Generation.UNKNOWN


def _commands(src: Path, migrated: Path, tmp_path: Path) -> dict[str, list[str]]:
    return {
        "info": ["info", str(src)],
        "ls": ["ls", str(src)],
        "migrate": ["migrate", str(src), str(tmp_path / "out")],
        "verify": ["verify", str(src), str(migrated)],
        "reshard": ["reshard", str(src), "--chunks-per-shard", "2"],
        "reshard-dst": ["reshard", str(src), str(tmp_path / "resharded"), "--chunks-per-shard", "2"],
    }


@pytest.mark.parametrize(
    "kind, fragments",
    [("v3", ("already Zarr v3", "nothing to migrate")),
     pytest.param("v3_array", ("already Zarr v3",), marks=pytest.mark.slow),  # six commands each: v3 and v2 stay fast
     ("v2", ("Zarr v2", "not draft-era"))],
)
def test_other_generations_are_named_in_every_command(other_generations, tmp_path, kind, fragments):
    """... each command with its own advice: `reshard` and `verify` do not say "nothing to migrate"."""
    src = other_generations[kind]
    for name, args in _commands(src, other_generations["migrated"], tmp_path).items():
        line = one_line(*run(*args)[::2], 7, str(src), fragments[0])
        assert "invalid" not in line, (name, line)
        advice = {"reshard": "nothing to reshard", "verify": "nothing to verify"}.get(args[0])
        assert all(f in line for f in fragments[1:]) if advice is None else advice in line, (name, line)
        assert advice is None or "nothing to migrate" not in line, (name, line)
    assert not (tmp_path / "out").exists() and not (tmp_path / "resharded").exists()
    for opener in (open_draft, open_v3):
        with pytest.raises(StoreNotFoundError, match=fragments[0]):
            opener(str(src))
    proc = subprocess.run([*CLI, "info", str(src)], capture_output=True, text=True, timeout=300)
    one_line(proc.returncode, proc.stderr, 7, *fragments)
