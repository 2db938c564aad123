"""The command line's surface (issue 27), in real processes: what goes to stdout (results,
text or one JSON document) and what to stderr (warnings, progress, errors), the words of
the reports and of argparse's errors, and the exit codes."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numcodecs
import numpy as np
import pytest

from sharding_store import create_draft_array, create_draft_group

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
CLI = [sys.executable, "-m", "sharding_store.cli"]


def cli(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``sharding-store ARGS`` in a child process, its streams captured apart."""
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def draft(tmp_path_factory) -> Path:
    """/g/img sharded (2 x 2 chunks per shard, 4 shards), /g/zl unsharded zlib (only zarr-python
    reads zlib: migrate warns about it), one group."""
    root = tmp_path_factory.mktemp("surface") / "draft.zr3"
    create_draft_group(str(root), "g")
    img = create_draft_array(str(root), "g/img", shape=(8, 8), chunks=(2, 2), dtype="<u2", chunks_per_shard=(2, 2))
    img[...] = np.arange(64, dtype="<u2").reshape(8, 8)
    zl = create_draft_array(str(root), "g/zl", shape=(6,), chunks=(3,), dtype="<i4", compressor=numcodecs.Zlib(level=1))
    zl[...] = np.arange(6)
    return root


# --------------------------------------------------------------------------- item 6: streams


@pytest.mark.parametrize("as_json", [False, True])
def test_warnings_go_to_stderr_results_to_stdout(draft, tmp_path, as_json):
    proc = cli("migrate", draft, tmp_path / "out.zarr", *(["--json"] if as_json else []))
    assert proc.returncode == 0, proc.stderr
    assert not [w for w in proc.stdout.splitlines() if w.startswith("warning")]
    (line,) = [w for w in proc.stderr.splitlines() if w.startswith("warning: ")]
    assert "g/zl" in line and "zarr-python" in line
    if as_json:
        doc = json.loads(proc.stdout)  # stdout is the JSON document and nothing else
        assert any("g/zl" in w for w in doc["warnings"])
    else:
        assert proc.stdout.startswith("migrated ")


def test_progress_goes_to_stderr(draft, tmp_path):
    proc = cli("migrate", draft, tmp_path / "out.zarr", "--progress", "--json")
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)
    assert "migrate" in proc.stderr


# --------------------------------------------------------------------------- item 8: argparse errors


def one_error_line(proc: subprocess.CompletedProcess[str], code: int = 2) -> str:
    """The one line on stderr of a failed command, after its one program-name prefix."""
    assert proc.returncode == code and proc.stdout == "", (proc.returncode, proc.stdout, proc.stderr)
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("sharding-store: error: "), line
    rest = line.removeprefix("sharding-store: error: ")
    assert "sharding-store:" not in rest and "error:" not in rest, line  # one prefix
    return rest


@pytest.mark.parametrize("words, expected", [
    (["migrate", "A", "B", "--overwite"], "migrate: unrecognized arguments: --overwite (did you mean --overwrite?)"),
    (["reshard", "A", "--chunks-per-shad", "2"], "reshard: unrecognized arguments: --chunks-per-shad 2 "
                                                 "(did you mean --chunks-per-shard?)"),
    (["info", "A", "--jsn"], "info: unrecognized arguments: --jsn (did you mean --json?)"),
    (["verify", "A", "B", "--max-diferences=3"], "(did you mean --max-differences?)"),
    (["migrat", "A", "B"], "unknown command 'migrat' (choose from 'info', 'ls', 'migrate', 'verify', 'reshard', "
                           "'materialize') (did you mean migrate?)"),
    (["verfy", "A", "B"], "(did you mean verify?)"),
    (["migrate", "A", "B", "--index-location", "ends"], "(did you mean end?)"),
    (["info"], "info: the following arguments are required: PATH_OR_URL"),
])
def test_usage_errors_have_one_prefix_and_suggest(words, expected):
    line = one_error_line(cli(*words))
    assert line == expected or (expected.startswith("(") and line.endswith(expected)), line


def test_no_suggestion_when_nothing_is_close():
    line = one_error_line(cli("migrate", "A", "B", "--zzzzzz"))
    assert line == "migrate: unrecognized arguments: --zzzzzz"
    assert "did you mean" not in one_error_line(cli("xyzzy"))


# --------------------------------------------------------------------------- item 9: words


PACKAGE = Path(__file__).resolve().parents[3] / "sharding_store"


@pytest.fixture(scope="module")
def one_of_each(tmp_path_factory) -> Path:
    """One group holding one sharded array of one shard."""
    root = tmp_path_factory.mktemp("one") / "one.zr3"
    create_draft_group(str(root), "g")
    a = create_draft_array(str(root), "g/a", shape=(4,), chunks=(2,), dtype="<i2", chunks_per_shard=(2,))
    a[...] = np.arange(4)
    return root


def test_counts_of_one_are_singular(one_of_each, tmp_path):
    dst = tmp_path / "out.zarr"
    migrated = cli("migrate", one_of_each, dst)
    assert migrated.returncode == 0, migrated.stderr
    head = migrated.stdout.splitlines()[0]
    assert head.startswith("migrated 1 array, 2 groups: 1 shard, "), head  # the root and g
    verified = cli("verify", one_of_each, dst)
    assert verified.returncode == 0 and verified.stdout.startswith("verified: 1 array, 1 shard, 2 chunks: identical")
    resharded = cli("reshard", one_of_each, tmp_path / "re.zr3", "--chunks-per-shard", "1")
    assert resharded.returncode == 0, resharded.stderr
    assert "1 array repacked" in resharded.stdout and "2 objects written" in resharded.stdout
    for proc in (migrated, verified, resharded):
        assert "(s)" not in proc.stdout + proc.stderr and " 1 arrays" not in proc.stdout


def _message_texts(tree: ast.AST) -> Iterator[ast.Constant]:
    """The string constants of a module that are not docstrings (messages, report lines)."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node


def test_no_count_in_the_package_says_s_in_parentheses():
    """Every count goes through ``plural``: no message of the package spells ``noun(s)``."""
    found = [f"{p.relative_to(PACKAGE)}:{c.lineno}: {c.value!r}" for p in sorted(PACKAGE.rglob("*.py"))
             for c in _message_texts(ast.parse(p.read_text())) if re.search(r"[a-z]\(s\)", c.value)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("kind", ["v3", "v2"])
def test_reshard_and_verify_of_another_generation_say_their_own_word(draft, tmp_path, kind):
    import zarr

    other = tmp_path / f"{kind}.zarr"
    zarr.open_group(str(other), mode="w", zarr_format=3 if kind == "v3" else 2).create_array("x", shape=(2,), dtype="i1")
    migrated = tmp_path / "migrated.zarr"
    assert cli("migrate", draft, migrated).returncode == 0
    for words, says in ((["reshard", other, "--chunks-per-shard", "2"], "nothing to reshard"),
                        (["verify", other, migrated], "nothing to verify"),
                        (["migrate", other, tmp_path / "out"], "nothing to migrate")):
        line = one_error_line(cli(*words), 7)
        assert str(other) in line and ("Zarr v3" if kind == "v3" else "Zarr v2") in line and says in line, line
        assert words[0] == "migrate" or "nothing to migrate" not in line, line


# --------------------------------------------------------------------------- item 2: verify's differences


@pytest.fixture
def three_differences(draft, tmp_path) -> Path:
    """A migration of ``draft`` with three objects of /g/img removed."""
    dst = tmp_path / "out.zarr"
    assert cli("migrate", draft, dst).returncode == 0
    for name in ("0/0", "0/1", "1/0"):
        (dst / "g/img/c" / name).unlink()
    return dst


@pytest.mark.parametrize("n", [2, 3])
def test_verify_lists_max_differences_in_text_mode(draft, three_differences, n):
    proc = cli("verify", draft, three_differences, "--max-differences", str(n))
    assert proc.returncode == 9
    head, *listed = proc.stdout.splitlines()
    assert head.startswith("verified: ") and head.count("3 differences") == 1, head
    keys = [line.split(":")[0].strip() for line in listed[:n] if ": missing" in line]
    assert len(keys) == n and keys == sorted(keys) and set(keys) <= {"g/img/c/0/0", "g/img/c/0/1", "g/img/c/1/0"}
    assert listed[n:] == (["  … (+1 more; --max-differences N lists more)"] if n == 2 else [])
    (error,) = proc.stderr.splitlines()  # the one error line stays, naming the first
    assert error.startswith("sharding-store: error: ") and f"3 differences; first: {keys[0]}" in error
    as_json = cli("verify", draft, three_differences, "--max-differences", str(n), "--json")
    doc = json.loads(as_json.stdout)
    assert as_json.returncode == 9 and doc["differences"] == 3 and len(doc["first"]) == n and as_json.stderr == ""


# --------------------------------------------------------------------------- items 4 and 5: what migrate says it did


def test_migrate_help_does_not_promise_verbatim_copies_under_portable():
    proc = cli("migrate", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for found in re.finditer("verbatim", text):  # each claim says "not with --portable" next to it
        near = text[max(0, found.start() - 60):found.end() + 60]
        assert "portable" in near or "not copied verbatim" in near, near
    portable = text[text.index("--portable make"):text.index("--dimension-names PATH=NAME,NAME... name")]
    assert "re-encoded, not copied verbatim" in portable and "names them" in portable


def test_portable_report_names_the_re_encoded_arrays(draft, tmp_path):
    portable = cli("migrate", draft, tmp_path / "p.zarr", "--portable")
    assert portable.returncode == 0, portable.stderr
    (line,) = [x for x in portable.stdout.splitlines() if "re-encoded" in x and "g/" in x]
    assert line.strip().startswith("re-encoded") and "/g/zl" in line and "/g/img" not in line, line
    plain = cli("migrate", draft, tmp_path / "v.zarr")
    assert plain.returncode == 0 and "re-encoded (" not in plain.stdout
    dry = cli("migrate", draft, tmp_path / "d.zarr", "--portable", "--dry-run")
    assert [x.split(":")[0].strip() for x in dry.stdout.splitlines() if "re-encoded" in x] == ["g/zl"]


def test_migrate_report_explains_its_two_byte_counts(draft, tmp_path):
    proc = cli("migrate", draft, tmp_path / "out.zarr", "--json")
    doc = json.loads(proc.stdout)
    source, written = doc["bytes"], doc["bytes_written"] + doc["bytes_copied"]
    assert written == source + 4 * 4  # the only difference: a crc32c after each of /g/img's 4 shard indices
    text = cli("migrate", draft, tmp_path / "text.zarr").stdout
    head, now, why = text.splitlines()[:3]
    assert head.endswith(f"{source} B in " + head.split(" B in ")[1]) and f"{written} B" in now, text
    assert why.strip() == (f"{written} B written for {source} B in the source (+16 B: the shard indices rebuilt "
                           "with a 4-byte crc32c checksum each)")
    same = cli("migrate", draft, tmp_path / "plain.zarr", "--no-index-checksum").stdout
    assert "written for" not in same  # the draft's compact shards copied byte for byte: one count, nothing to explain


# --------------------------------------------------------------------------- item 10: install hints


ROOT = PACKAGE.parent
HINT = re.compile(r"pip install (\S+)")


def _hint_files() -> list[Path]:
    return [*sorted(PACKAGE.rglob("*.py")), ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_install_hint_quotes_its_extras():
    """``pip install sharding-store[dask]`` fails in zsh (no match for the glob): every hint
    with an extra quotes it, in the package's messages, the README and docs/."""
    hints = [(f"{p.relative_to(ROOT)}:{n}", m[1]) for p in _hint_files() if p.exists()
             for n, line in enumerate(p.read_text().splitlines(), 1) for m in HINT.finditer(line)]
    assert len(hints) > 5  # the search finds them
    bad = [f"{where}: pip install {word}" for where, word in hints if "[" in word and not word.startswith("'")]
    assert not bad, "\n".join(bad)


def test_the_scheduler_hint_runs_in_a_shell_that_refuses_unmatched_globs(draft, tmp_path):
    """The hint printed when dask's ``distributed`` is missing, pasted into a shell where an
    unmatched glob is an error (bash ``failglob``, as zsh by default), is one word for pip."""
    code = "import sys; sys.modules['distributed'] = None; from sharding_store.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, "migrate", str(draft), str(tmp_path / "out"),
                           "--scheduler", "tcp://127.0.0.1:1"], capture_output=True, text=True, timeout=300)
    line = one_error_line(proc)
    (hint,) = re.findall(r"\((pip install [^)]*)\)", line)
    shell = subprocess.run(["bash", "-O", "failglob", "-c", f"set -- {hint}; printf '%s\\n' \"$@\""], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    assert shell.returncode == 0 and shell.stdout.splitlines() == ["pip", "install", "sharding-store[dask]"], shell


# --------------------------------------------------------------------------- item 13: ls


COMMANDS = ("info", "ls", "migrate", "verify", "reshard")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_help_has_a_description(command):
    proc = cli(command, "--help")
    assert proc.returncode == 0 and proc.stderr == ""
    description = proc.stdout.split("\n\n")[1]  # after the usage block, before the arguments
    assert not description.startswith(("positional arguments", "options")), proc.stdout
    assert len(description.split()) >= 10, description


def test_ls_lists_nodes_in_text_and_json(draft):
    text = cli("ls", draft)
    assert text.returncode == 0 and text.stderr == ""
    assert text.stdout.splitlines() == ["/\tgroup", "/g\tgroup", "/g/img\tarray\t8 x 8\t<u2", "/g/zl\tarray\t6\t<i4"]
    doc = json.loads(cli("ls", draft, "--json").stdout)
    assert doc["source"] == str(draft)
    assert doc["nodes"] == [{"path": "", "kind": "group"}, {"path": "g", "kind": "group"},
                            {"path": "g/img", "kind": "array", "shape": [8, 8], "dtype": "<u2"},
                            {"path": "g/zl", "kind": "array", "shape": [6], "dtype": "<i4"}]
    assert json.loads(cli("ls", draft, "--json", "--path", "g/zl").stdout)["nodes"] == doc["nodes"][3:]


def test_ls_json_lists_damaged_nodes(draft, tmp_path):
    import shutil

    copy = tmp_path / "damaged.zr3"
    shutil.copytree(draft, copy)
    (copy / "meta/root/g/zl.array.json").write_text("{not json")
    doc = json.loads(cli("ls", copy, "--json").stdout)
    assert {"path": "g/zl", "kind": "damaged", "error": "DraftMetadataError"} in doc["nodes"]
    assert "/g/zl\tdamaged\tDraftMetadataError" in cli("ls", copy).stdout.splitlines()


def test_the_readme_shows_ls():
    assert "sharding-store ls " in (ROOT / "README.md").read_text()


# --------------------------------------------------------------------------- items 15 and 1: one JSON schema


SCHEMA = "sharding-store/1"
#: keys of the shared vocabulary no JSON report may use (what they were renamed to)
RETIRED_KEYS = {"src": "source", "dst": "destination", "store": "source", "written": "objects_written",
                "copied": "objects_copied", "shards": "objects"}
#: the keys each command's report holds besides schema, command and ok
REQUIRED = {
    "info": {"source", "nodes", "arrays", "damaged"},
    "ls": {"source", "nodes"},
    "migrate": {"source", "destination", "arrays", "objects", "objects_written", "objects_copied", "bytes"},
    "verify": {"source", "destination", "objects", "chunks", "differences"},
    "reshard": {"source", "destination", "objects_written", "objects_copied", "objects_removed"},
}


def check_schema(doc: dict, command: str) -> None:
    """The shared part of every ``--json`` document, and none of the retired key names
    anywhere in it (nested reports and array entries included)."""
    assert doc["schema"] == SCHEMA and doc["command"] == command and isinstance(doc["ok"], bool), doc
    todo: list = [doc]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            assert not set(node) & set(RETIRED_KEYS), (command, sorted(set(node) & set(RETIRED_KEYS)))
            todo += node.values()
        elif isinstance(node, list):
            todo += node


def test_every_command_answers_json_in_one_schema(draft, tmp_path):
    dst = tmp_path / "out.zarr"
    runs = {
        "info": cli("info", draft, "--json"),
        "ls": cli("ls", draft, "--json"),
        "migrate": cli("migrate", draft, dst, "--json"),
        "verify": cli("verify", draft, dst, "--json"),
        "reshard": cli("reshard", draft, tmp_path / "re.zr3", "--chunks-per-shard", "1", "--json"),
    }
    for command, proc in runs.items():
        assert proc.returncode == 0, (command, proc.stderr)
        doc = json.loads(proc.stdout)
        check_schema(doc, command)
        assert doc["ok"] is True and REQUIRED[command] <= set(doc), (command, sorted(REQUIRED[command] - set(doc)))
    migrated = json.loads(runs["migrate"].stdout)
    assert migrated["source"] == str(draft) and migrated["destination"] == str(dst)
    by_path = {a["path"]: a for a in migrated["arrays"]}  # an unsharded array's objects are not called shards
    assert by_path["g/zl"]["chunks_per_shard"] is None and by_path["g/zl"]["objects"] == 2
    assert by_path["g/img"]["objects"] == 4 and migrated["objects"] == 6
    check_schema(migrated["verified"] | {"schema": SCHEMA, "command": "migrate", "ok": True}, "migrate")
    dry = json.loads(cli("migrate", draft, tmp_path / "dry.zarr", "--dry-run", "--json").stdout)
    check_schema(dry, "migrate")


@pytest.mark.parametrize("kind, generation", [("v3", "Zarr v3"), ("v2", "Zarr v2")])
def test_not_draft_data_is_a_json_answer_in_every_command(draft, tmp_path, kind, generation):
    import zarr

    other = tmp_path / f"{kind}.zarr"
    zarr.open_group(str(other), mode="w", zarr_format=3 if kind == "v3" else 2).create_array("x", shape=(2,), dtype="i1")
    migrated = tmp_path / "migrated.zarr"
    assert cli("migrate", draft, migrated).returncode == 0
    for words in (["info", other], ["ls", other], ["migrate", other, tmp_path / "out"], ["verify", other, migrated],
                  ["reshard", other, "--chunks-per-shard", "2"]):
        proc = cli(*words, "--json")
        assert proc.returncode == 7, (words, proc.stderr)
        doc = json.loads(proc.stdout)
        check_schema(doc, words[0])
        assert doc["ok"] is False and doc["exit_code"] == 7 and doc["draft"] is False, doc
        assert doc["generation"] == generation and doc["source"] == str(other), doc
        assert doc["error"]["class"] == "OtherGenerationError" and str(other) in doc["error"]["message"]
        (line,) = proc.stderr.splitlines()  # the error line stays on stderr
        assert line == f"sharding-store: error: {doc['error']['message']}"
    assert cli("info", other).stdout == ""  # without --json: nothing on stdout, as before


def test_a_usage_error_with_json_is_a_json_answer():
    proc = cli("migrate", "A", "B", "--json", "--overwite")
    doc = json.loads(proc.stdout)
    check_schema(doc, "migrate")
    assert proc.returncode == 2 and doc["exit_code"] == 2 and doc["error"]["class"] == "UsageError"
    assert "did you mean --overwrite?" in doc["error"]["message"]


# --------------------------------------------------------------------------- item 14: progress


@pytest.fixture(scope="module")
def many_arrays(tmp_path_factory) -> Path:
    """40 small sharded arrays: planning (one listing per array) runs while units complete."""
    root = tmp_path_factory.mktemp("many") / "many.zr3"
    create_draft_group(str(root), "g")
    for i in range(40):
        a = create_draft_array(str(root), f"g/a{i:02d}", shape=(4,), chunks=(1,), dtype="<u1", chunks_per_shard=(2,))
        a[...] = i
    return root


def frames(log: str) -> list[str]:
    """Every frame a bar drew into a log (tqdm separates them with carriage returns)."""
    return [f.strip() for line in log.split("\n") for f in line.split("\r") if f.strip()]


def test_progress_in_a_log_shows_a_percentage_only_of_the_final_total_and_ends_cleanly(many_arrays, tmp_path):
    log = tmp_path / "progress.log"
    with log.open("w") as err:
        proc = subprocess.run([*CLI, "migrate", str(many_arrays), str(tmp_path / "out.zarr"), "--progress", "--jobs", "1"],
                              stdout=subprocess.PIPE, stderr=err, text=True, timeout=300)
    assert proc.returncode == 0
    text = log.read_bytes().decode()  # not read_text: its universal newlines would turn "\r" into "\n"
    assert text.endswith("\n")
    lines = text.rstrip("\n").split("\n")
    final = {line.split("\r")[-1].split(":")[0]: line.split("\r")[-1] for line in lines}  # the last frame of each bar
    assert set(final) == {"migrate", "verify"}, repr(text)
    for bar in ("migrate", "verify"):  # each bar's last frame is a whole line: done, with its final total
        assert "100%" in final[bar] and "80/80" in final[bar], final[bar]
    drawn = frames(text)
    with_percent = [f for f in drawn if "%" in f]
    assert with_percent and all("/80 " in f for f in with_percent), with_percent  # never a percentage of a partial total
    counting = [f for f in drawn if "planned so far" in f]  # before the total is known: counts only
    assert all("%" not in f for f in counting)
