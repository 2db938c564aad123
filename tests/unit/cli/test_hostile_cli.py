"""The hostile corpus through the command line and ``open_draft``: one line on stderr, the
documented exit code, never a traceback, never wrong values.

Every case runs ``info``, ``info --strict``, ``migrate``, ``migrate --skip-damaged`` and
``verify`` (with and without ``--skip-damaged``) through the CLI's ``main`` (what the
console script runs), and one case of each kind again as real subprocesses (which
also catches anything printed outside ``main``); subprocesses cost ~1 s each here.
Expected codes: ``info`` reports damage and exits 0 (``--strict``: the damage's code);
``migrate``/``verify`` exit with the damage's code (3 metadata, 4 shard; a lost storage
transformer is a metadata defect: 3) unless ``--skip-damaged``; undecodable payloads
are copied verbatim (never decoded), so they migrate and verify.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import zarr

from sharding_store import open_draft
from sharding_store.cli import main
from sharding_store.errors import DraftMetadataError, StoreNotFoundError
from tests import hostile
from tests.draft_factory import tree_hash

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
CLI = [sys.executable, "-m", "sharding_store.cli"]
#: damage that the commands find without decoding payloads
DETECTED = {"metadata", "shard", "lost_transformer"}


def detected(case: hostile.Case) -> bool:
    return case.level in DETECTED and (case.error is not None or case.level == "lost_transformer")


def damage_code(case: hostile.Case) -> int:
    """The exit code of the case's damage (0: legal input, or damage no command decodes)."""
    if case.level == "lost_transformer":
        return DraftMetadataError.exit_code
    return case.error.exit_code if case.error is not None and (detected(case) or case.level == "store") else 0


def expected(case: hostile.Case) -> dict[str, int]:
    """Exit code per command of the matrix."""
    if case.level == "store":
        return dict.fromkeys(("info", "strict", "migrate", "skip", "verify", "verify_skip"), StoreNotFoundError.exit_code)
    code = damage_code(case)
    return {"info": 0, "strict": code, "migrate": code, "skip": 0, "verify": code, "verify_skip": 0}


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def run(*args: str) -> Result:
    """The CLI in this process, as the console script runs it (stdout/stderr captured)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return Result(code, out.getvalue(), err.getvalue())


def run_process(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)


def one_line_error(proc: Result | subprocess.CompletedProcess, code: int) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    if code:
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("sharding-store: error: "), proc.stderr


def run_case(case: hostile.Case, root: Path) -> dict:
    """The command matrix of one case (each verify against the migration before it)."""
    src = hostile.build(case, root)
    before = tree_hash(src)
    plain, skip = root / f"{case.name}.plain", root / f"{case.name}.skip"
    out = {
        "src": src, "plain_dst": plain, "skip_dst": skip,
        "info": run("info", str(src)),
        "strict": run("info", str(src), "--strict"),
        "migrate": run("migrate", str(src), str(plain), "--jobs", "2"),
        "skip": run("migrate", str(src), str(skip), "--skip-damaged", "--json", "--jobs", "2"),
    }
    target = plain if out["migrate"].returncode == 0 else skip
    out["verify"] = run("verify", str(src), str(target))
    out["verify_skip"] = run("verify", str(src), str(skip), "--skip-damaged")
    out["unchanged"] = tree_hash(src) == before if src.exists() else True
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("hostile-cli")
    return {c.name: run_case(c, root) for c in hostile.CASES}


@pytest.mark.parametrize("case", hostile.CASES, ids=lambda c: c.name)
def test_exit_codes_and_one_line_errors(case, results):
    got = results[case.name]
    for command, code in expected(case).items():
        one_line_error(got[command], code)
    assert got["unchanged"], "the source changed"


#: one case of each kind, run again as real processes
PROCESS_CASES = ["no_entry_point", "metadata_not_json", "half_sentinel", "undecodable_payload",
                 "stray_key_under_data_prefix", "overlapping_entries", "lost_transformer"]


@pytest.mark.slow  # one CLI process per hostile store
@pytest.mark.parametrize("name", PROCESS_CASES)
def test_as_subprocesses(name, results, tmp_path):
    case, got = hostile.CASE_BY_NAME[name], results[name]
    codes = expected(case)
    one_line_error(run_process("info", str(got["src"]), "--strict"), codes["strict"])
    one_line_error(run_process("migrate", str(got["src"]), str(tmp_path / "out")), codes["migrate"])
    one_line_error(run_process("verify", str(got["src"]), str(got["skip_dst"])), codes["verify"])


@pytest.mark.parametrize("case", [c for c in hostile.CASES if detected(c)], ids=lambda c: c.name)
def test_damaged_array_is_never_published(case, results):
    got = results[case.name]
    fragment = case.fragment if case.level != "lost_transformer" else "--assume-chunks-per-shard bad=2,2"
    for command in ("migrate", "verify"):
        assert fragment in got[command].stderr and "'bad'" in got[command].stderr, command
    assert fragment in got["strict"].stderr
    assert not (got["plain_dst"] / "bad" / "zarr.json").exists()
    if case.level != "shard":  # found while planning: nothing at all was written
        assert not got["plain_dst"].exists()
    # --skip-damaged: the rest is migrated and verified, the damaged array listed with its reason
    report = json.loads(got["skip"].stdout)
    assert report["verified"]["ok"] and [a["path"] for a in report["arrays"]] == ["good"]
    (skipped,) = report["skipped"]["arrays"]
    assert skipped["path"] == "bad" and skipped["kind"] == "damaged" and fragment in skipped["reason"]
    assert not [p for p in (got["skip_dst"] / "bad").rglob("*") if p.is_file()]  # partial shards removed
    assert np.array_equal(zarr.open_array(str(got["skip_dst"]), path="good", mode="r")[...], hostile.values("good"))
    assert "1 damaged array skipped" in got["verify_skip"].stdout


@pytest.mark.parametrize("case", [c for c in hostile.CASES if not detected(c) and c.level != "store"], ids=lambda c: c.name)
def test_legal_and_undetected_cases_migrate_both_arrays(case, results):
    got = results[case.name]
    for path in ("good", "bad"):
        expected_values = hostile.expected_values(case, path)
        if case.level == "chunk" and path == "bad":  # carried over verbatim: zarr fails on the same chunk
            with pytest.raises(Exception):
                zarr.open_array(str(got["plain_dst"]), path=path, mode="r")[...]
            continue
        assert np.array_equal(zarr.open_array(str(got["plain_dst"]), path=path, mode="r")[...], expected_values), path
    if case.level == "stray":
        assert "stray key" in got["migrate"].stderr  # a warning: on stderr


def test_info_lists_damage_and_json_has_it(results):
    got = results["shape_negative"]
    assert "damaged (DraftMetadataError): meta/root/bad.array.json: field 'shape'" in got["info"].stdout
    assert "/good" in got["info"].stdout
    lost = results["lost_transformer"]["info"].stdout
    assert "problem: array 'bad' looks sharded with chunks_per_shard (2, 2)" in lost
    shard = results["truncated_shard"]["info"].stdout
    assert "problem: data/root/bad/c0/0" in shard


def test_info_json_damaged_nodes(tmp_path):
    src = hostile.build(hostile.CASE_BY_NAME["metadata_not_json"], tmp_path)
    proc = run("info", str(src), "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and [a["path"] for a in doc["arrays"]] == ["good"]
    (damaged,) = doc["damaged"]
    assert damaged["path"] == "bad" and damaged["error"] == "DraftMetadataError" and "invalid JSON" in damaged["reason"]


# --------------------------------------------------------------------------- open_draft


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile-open")
    return {c.name: hostile.build(c, root) for c in hostile.CASES}


@pytest.mark.parametrize(
    "case",
    [
        c for c in hostile.CASES
    ],
    ids=lambda c: c.name,
)
def test_open_draft_raises_the_specific_error_or_reads_right_values(case, corpus):
    src = str(corpus[case.name])
    for path in ("good", case.bad_path):
        try:
            values = open_draft(src, path)[...]
        except Exception as e:  # noqa: BLE001 - checked just below
            if case.level == "lost_transformer" and path == case.bad_path:  # refused, never read as chunks
                assert isinstance(e, DraftMetadataError) and "resize()" in str(e) and "bad" in str(e), repr(e)
                lost = open_draft(src, path, assume_chunks_per_shard=hostile.CPS)[...]
                assert np.array_equal(lost, hostile.values(path))
                continue
            assert case.error is not None and type(e) is case.error, repr(e)
            assert case.fragment in str(e) and (path == case.bad_path or case.level == "store"), str(e)
            continue
        assert np.array_equal(values, hostile.expected_values(case, path)), (case.name, path)
