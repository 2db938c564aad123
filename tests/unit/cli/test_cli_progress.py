"""Progress and reports as people expect from long jobs (issue 16, last bullet).

Bars count what the final report counts, in its words ("shards" only when every object
is a shard), with the running total of bytes; verification has its own bar; every long
command takes ``--progress/--no-progress`` (default: a bar only on a terminal); Ctrl-C and
SIGTERM end with exit 130 and one line saying how to finish; a dry run reports no rate; a
resumed run tells what it wrote from what was already done; copies the stores make are
called kernel or server-side copies; ``info`` names the generation and shows attributes.
"""

from __future__ import annotations

import importlib
import io
import json
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from sharding_store import create_draft_array, create_draft_group, migrate, verify
from sharding_store.cli import EXIT_INTERRUPTED, main
from sharding_store.ops.jobs import cancelling, copy_words, run_bounded
from sharding_store.ops.progress import Bar, NullBar, human_bytes, object_noun
from sharding_store.stores import as_inner
from sharding_store.testing import SLOW_LINE
from tests.draft_factory import make_big_array, make_hierarchy, read_v3
from tests.gen2023_writer import write_2023, write_group

# the modules (``sharding_store.migrate`` is the function, as the package exports it)
migrate_module, verify_module, inspect_module, inplace_module, reshard_module = (
    importlib.import_module(f"sharding_store.{m}") for m in (
        "ops.migration", "ops.verification", "api.evidence", "ops.upgrade", "ops.resharding"))
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
CLI = [sys.executable, "-m", "sharding_store.cli"]
REPO = str(Path(__file__).resolve().parents[3])
N_SHARDS = 24


@pytest.fixture
def sharded(tmp_path) -> tuple[Path, np.ndarray]:
    """A store whose only array is sharded: 24 shards of 4 chunks."""
    src = tmp_path / "sharded.zr3"
    return src, make_big_array(src, shards=N_SHARDS)


@pytest.fixture
def mixed(tmp_path) -> Path:
    """Sharded and unsharded arrays (``make_hierarchy``)."""
    src = tmp_path / "mixed.zr3"
    make_hierarchy(src)
    return src


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=REPO)


class SpyBar(NullBar):
    """Records what a driver shows: its words, every advance, the running totals."""

    made: list[SpyBar] = []

    def __init__(self, total: int | None, desc: str, unit: str, enabled: bool | None) -> None:
        self.desc, self.unit, self.total, self.count, self.nbytes = desc, unit, total or 0, 0, 0
        self.steps: list[tuple[int, int]] = []
        SpyBar.made.append(self)

    def grow(self, n: int) -> None:
        self.total += n

    def advance(self, n: int = 1, nbytes: int = 0) -> None:
        self.count += n
        self.nbytes += nbytes
        self.steps.append((n, nbytes))


@pytest.fixture
def spy(monkeypatch) -> list[SpyBar]:
    SpyBar.made = []
    monkeypatch.setattr(migrate_module, "progress_bar", SpyBar)
    monkeypatch.setattr(verify_module, "progress_bar", SpyBar)
    return SpyBar.made


# --------------------------------------------------------------------------- the bar itself


def test_the_bar_shows_the_running_total_of_bytes_not_the_last_units():
    out = io.StringIO()
    with Bar(0, "migrate", "shard", file=out, mininterval=0) as bar:
        bar.grow(3)
        for _ in range(3):
            bar.advance(1, 1024)
        assert (bar.count, bar.nbytes, bar.total) == (3, 3072, 3)
    frames = out.getvalue().split("\r")
    last = [f for f in frames if "3/3" in f]
    assert last and "3.0 KiB" in last[-1] and "1.0 KiB" not in last[-1]
    assert any("2/3" in f and "2.0 KiB" in f for f in frames)


def test_the_bar_reaches_a_reports_counters():
    with Bar(10, "reshard", "object", file=io.StringIO(), mininterval=0) as bar:
        bar.reach(4, 2048)
        bar.reach(3, 1024)  # behind what is shown already: nothing goes back
        bar.reach(7, 4096)
        assert (bar.count, bar.nbytes) == (7, 4096)


def test_words_and_sizes():
    assert (object_noun(True), object_noun(True, 1), object_noun(False), object_noun(False, 1)) == \
        ("shards", "shard", "objects", "object")
    assert [human_bytes(n) for n in (0, 1023, 1536, 3 << 20, None)] == ["0 B", "1023 B", "1.5 KiB", "3.0 MiB", "unknown"]


def test_no_bar_shown_means_tqdm_is_not_imported(sharded, tmp_path):
    src, _ = sharded
    code = ("import sys\nfrom sharding_store.cli import main\n"
            f"assert main(['migrate', {str(src)!r}, {str(tmp_path / 'out')!r}]) == 0\n"
            "print('tqdm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert out.strip().splitlines()[-1] == "False"


# --------------------------------------------------------------------------- what the bars count


def test_migrate_bar_counts_shards_and_the_bytes_written_so_far(sharded, tmp_path, spy):
    src, _ = sharded
    report = migrate(src, tmp_path / "out", jobs=2)
    bar = next(b for b in spy if b.desc == "migrate")
    assert bar.unit == "shard" and report.all_shards
    assert bar.count == bar.total == report.shards == N_SHARDS
    assert len(bar.steps) == N_SHARDS and bar.nbytes == report.totals.bytes_now > max(n for _, n in bar.steps)
    assert f"{N_SHARDS} shards" in report.summary().splitlines()[0]


def test_with_an_unsharded_array_bar_and_summary_say_objects(mixed, tmp_path, spy):
    report = migrate(mixed, tmp_path / "out")
    bar = next(b for b in spy if b.desc == "migrate")
    assert bar.unit == "object" and bar.count == bar.total == report.shards
    head, done, *rest = report.summary().splitlines()
    verified = next(line for line in rest if line.startswith("  verified: "))
    assert f"{report.shards} objects" in head and "shards" not in head and "shards" not in done
    assert f"{report.verification.check.objects} objects" in verified and "shards" not in verified


def test_a_verification_bar_in_migrate_and_in_verify(sharded, tmp_path, spy):
    src, _ = sharded
    migrate(src, tmp_path / "out")
    assert [b.desc for b in spy] == ["migrate", "verify"]
    spy.clear()
    report = verify(src, tmp_path / "out")
    (bar,) = spy
    assert (bar.desc, bar.unit) == ("verify", "shard")
    assert bar.count == bar.total == report.check.objects == N_SHARDS and bar.nbytes == report.check.bytes


@pytest.mark.slow  # CLI processes; the bars' in-process tests stay in the fast loop
def test_verification_bar_shown_with_progress_on_a_pipe_and_absent_by_default(sharded, tmp_path):
    src, _ = sharded
    done = cli("migrate", str(src), str(tmp_path / "out"), "--progress")
    assert done.returncode == 0, done.stderr
    assert "migrate:" in done.stderr and "verify:" in done.stderr and "shard" in done.stderr
    alone = cli("verify", str(src), str(tmp_path / "out"), "--progress")
    assert alone.returncode == 0 and "verify:" in alone.stderr
    quiet = cli("verify", str(src), str(tmp_path / "out"))
    assert quiet.returncode == 0 and quiet.stderr == ""


@pytest.mark.parametrize("command", ["migrate", "verify", "reshard", "info"])
def test_every_long_command_takes_no_progress(sharded, tmp_path, capsys, command):
    src, _ = sharded
    if command == "verify":
        migrate(src, tmp_path / "out")
    args = {"migrate": ["migrate", str(src), str(tmp_path / "new")],
            "verify": ["verify", str(src), str(tmp_path / "out")],
            "reshard": ["reshard", str(src), str(tmp_path / "re"), "--chunks-per-shard", "4"],
            "info": ["info", str(src)]}[command]
    code, _, err = run(capsys, *args, "--no-progress")
    assert code == 0 and err == ""


@pytest.mark.parametrize("command, word", [("reshard", "object"), ("info", "array")])
def test_progress_forces_a_bar_for_reshard_and_info(sharded, tmp_path, command, word):
    src, _ = sharded
    args = ["reshard", str(src), str(tmp_path / "re"), "--chunks-per-shard", "4"] if command == "reshard" else ["info", str(src)]
    done = cli(*args, "--progress")
    assert done.returncode == 0, done.stderr
    assert f"{word}/s" in done.stderr or f"{word} [" in done.stderr


# --------------------------------------------------------------------------- interruptions


def start_slowed(args: list[str]) -> subprocess.Popen:
    """The CLI with every work unit slowed (``run_with_fault --slow``), once its first unit
    runs. SIGINT is given its default action in the child (a background job may inherit it
    ignored), so Python turns it into KeyboardInterrupt as in a terminal."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.run_with_fault", "--slow", "0.5", "--", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stderr is not None
    line = proc.stderr.readline()
    if SLOW_LINE not in line:
        proc.kill()
        pytest.fail(f"the command did not start its units: {line!r}")
    return proc


@pytest.mark.slow  # a killed CLI
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_migration_exits_130_with_one_line_then_resumes(sharded, tmp_path, sig):
    src, values = sharded
    out = tmp_path / "out"
    proc = start_slowed(["migrate", str(src), str(out), "--jobs", "2"])
    time.sleep(0.3)
    sent = time.monotonic()
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED, stderr
    assert time.monotonic() - sent < 10  # the queued units were cancelled, not run
    assert "Traceback" not in stderr and stdout == ""
    (line,) = stderr.strip().splitlines()
    resume = f"sharding-store migrate {src} {out} --jobs 2 --resume"
    assert line == f"sharding-store: interrupted; run `{resume}` to finish (nothing written so far is lost)"
    assert not (out / "zarr.json").exists()  # interrupted before the end
    # the advice, word for word, finishes it
    done = subprocess.run([*CLI, *shlex.split(resume)[1:], "--json"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["skipped"]["objects"] + report["objects_written"] + report["objects_copied"] == N_SHARDS and report["verified"]["ok"]
    assert cli("verify", str(src), str(out)).returncode == 0
    assert np.array_equal(read_v3(out, "big"), values)


def test_the_pool_cancels_queued_work_when_the_consumer_is_interrupted():
    ran: list[int] = []
    lock = threading.Lock()

    def slow(i: int) -> int:
        time.sleep(0.05)
        with lock:
            ran.append(i)
        return i

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with cancelling(ThreadPoolExecutor(2)) as pool:
            for _ in run_bounded(pool, slow, ((i,) for i in range(1000)), window=4):
                raise KeyboardInterrupt
    assert time.monotonic() - started < 5 and len(ran) < 100  # not the 1000 queued


def test_the_advice_drops_overwrite_and_keeps_the_other_options(mixed, tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(migrate_module, "migrate", interrupted)
    code, _, err = run(capsys, "migrate", str(mixed), str(tmp_path / "out"), "--overwrite", "--chunks-per-shard", "2")
    assert code == EXIT_INTERRUPTED
    assert err == (f"sharding-store: interrupted; run `sharding-store migrate {mixed} {tmp_path / 'out'} "
                   "--chunks-per-shard 2 --resume` to finish (nothing written so far is lost)\n")


@pytest.mark.parametrize("name, advice", [("out", ()), ("out.json", ("--references-only",))],
                         ids=["copy", "virtual"])
def test_interrupted_while_verifying_a_complete_migration_advises_verify(sharded, tmp_path, capsys, monkeypatch,
                                                                         name, advice):
    """A copy is advised `verify`; a virtual migration (DST.json) the reference check it was running."""
    src, _ = sharded

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(verify_module, "verify", interrupted)  # what the migration calls once it verifies
    code, out, err = run(capsys, "migrate", str(src), str(tmp_path / name))
    assert code == EXIT_INTERRUPTED and out == ""
    assert err == (f"sharding-store: interrupted; the migration itself is complete; check it with "
                   f"`{' '.join(['sharding-store verify', str(src), str(tmp_path / name), *advice])}`\n")
    monkeypatch.undo()
    assert run(capsys, "verify", str(src), str(tmp_path / name), *advice)[0] == 0


@pytest.mark.parametrize("command", ["verify", "info", "dry-run"])
def test_interrupted_reading_commands_say_only_interrupted(sharded, tmp_path, capsys, monkeypatch, command):
    src, _ = sharded

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    if command == "verify":
        monkeypatch.setattr(verify_module, "verify", interrupted)
        args = ["verify", str(src), str(tmp_path)]
    elif command == "info":
        monkeypatch.setattr(inspect_module, "hierarchy_stats", interrupted)
        args = ["info", str(src)]
    else:
        monkeypatch.setattr(migrate_module, "migrate", interrupted)
        args = ["migrate", str(src), str(tmp_path / "out"), "--dry-run"]
    code, _, err = run(capsys, *args)
    assert (code, err) == (EXIT_INTERRUPTED, "sharding-store: interrupted\n")


def test_in_place_and_reshard_advice(sharded, tmp_path, capsys, monkeypatch):
    src, _ = sharded

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(inplace_module, "upgrade_in_place", interrupted)
    monkeypatch.setattr(reshard_module, "reshard", interrupted)
    _, _, err = run(capsys, "migrate", str(src), "--in-place")
    assert err == (f"sharding-store: interrupted; finish it with `sharding-store migrate {src} --in-place --resume` "
                   f"or roll it back with `sharding-store migrate {src} --in-place --undo`\n")
    _, _, err = run(capsys, "reshard", str(src), "--chunks-per-shard", "4")
    assert err == (f"sharding-store: interrupted; complete it with `sharding-store reshard {src} --resume` "
                   "(nothing written so far is lost)\n")
    _, _, err = run(capsys, "reshard", str(src), str(tmp_path / "copy"), "--chunks-per-shard", "4")
    assert err == (f"sharding-store: interrupted; {tmp_path / 'copy'} is incomplete: copy it again with "
                   f"`sharding-store reshard {src} {tmp_path / 'copy'} --chunks-per-shard 4 --overwrite`\n")


def test_the_sigterm_handler_is_only_installed_while_a_command_runs(sharded, capsys, monkeypatch):
    src, _ = sharded
    before = signal.getsignal(signal.SIGTERM)
    seen = []

    def probe(*args, **kwargs):
        seen.append(signal.getsignal(signal.SIGTERM))
        raise KeyboardInterrupt

    monkeypatch.setattr(inspect_module, "hierarchy_stats", probe)
    assert run(capsys, "info", str(src))[0] == EXIT_INTERRUPTED
    assert seen and seen[0] is not before and signal.getsignal(signal.SIGTERM) is before


# --------------------------------------------------------------------------- reports


def test_a_dry_run_reports_no_throughput(sharded, tmp_path, capsys):
    src, _ = sharded
    code, out, _ = run(capsys, "migrate", str(src), str(tmp_path / "out"), "--dry-run")
    assert code == 0 and out.startswith("dry run: would migrate")
    assert not re.search(r"B/s|MiB|\bin [0-9.]+ s\b", out.replace(str(tmp_path), "TMP")), out
    code, out, _ = run(capsys, "migrate", str(src), str(tmp_path / "out"), "--dry-run", "--json")
    assert json.loads(out)["throughput_mib_s"] is None
    code, out, _ = run(capsys, "migrate", str(src), str(tmp_path / "real"))
    assert re.search(r"in [0-9.]+ s \([0-9.]+ [KMG]?i?B/s\)", out.splitlines()[0])


def test_a_resumed_run_reports_what_it_wrote_apart_from_what_was_done(sharded, tmp_path, capsys):
    src, values = sharded
    out = tmp_path / "out"
    migrate(src, out)
    lost = sorted((out / "big" / "c").rglob("*"))
    lost = [p for p in lost if p.is_file()][:5]
    sizes = sum(p.stat().st_size for p in lost)
    for p in lost:
        p.unlink()
    (out / "zarr.json").unlink()
    code, text, _ = run(capsys, "migrate", str(src), str(out), "--resume")
    assert code == 0
    done = text.splitlines()[1]
    assert done == f"  written now: 5 shards, {human_bytes(sizes)} (5 by kernel copy); already done: {N_SHARDS - 5} shards"
    assert f"{N_SHARDS} shards" in text.splitlines()[0]  # the migrated store, whole
    for p in lost:
        p.unlink()
    code, text, _ = run(capsys, "migrate", str(src), str(out), "--resume", "--json")
    report = json.loads(text)
    assert (report["objects_written"] + report["objects_copied"], report["skipped"]["objects"]) == (5, N_SHARDS - 5)
    assert np.array_equal(read_v3(out, "big"), values)


def test_copies_the_stores_make_are_called_kernel_or_server_side_copies(sharded, tmp_path, capsys):
    src, _ = sharded
    code, out, _ = run(capsys, "migrate", str(src), str(tmp_path / "out"))
    assert f"({N_SHARDS} by kernel copy)" in out
    assert "filesystem" not in out and "copy_file_range" not in out and "compose" not in out
    assert copy_words(as_inner(str(tmp_path))) == "kernel copy"
    assert copy_words(as_inner("memory://progress-words")) == "server-side copy"
    code, out, _ = run(capsys, "reshard", str(src), "--chunks-per-shard", "4")
    assert code == 0 and "bytes moved by kernel copy" in out and "compose" not in out


# --------------------------------------------------------------------------- info


def test_info_names_the_generation_in_its_header(sharded, tmp_path, capsys):
    src, _ = sharded
    code, out, _ = run(capsys, "info", str(src))
    assert code == 0 and out.splitlines()[0].startswith(f"{src}: draft-era Zarr v3 (2022); ")
    new = tmp_path / "2023.zarr"
    write_group(new, "", {"title": "t"})
    write_2023(new, "a", np.arange(16, dtype="<u2").reshape(4, 4), chunks=(2, 2), cps=(2, 1))
    code, out, _ = run(capsys, "info", str(new))
    assert code == 0 and out.splitlines()[0].startswith(f"{new}: draft-era Zarr v3 (2023 intermediate); ")
    assert '  attributes title="t"' in out


def test_info_shows_attributes_shortened(tmp_path, capsys):
    root = tmp_path / "attrs.zr3"
    many = {f"k{i:02d}": i for i in range(12)}
    create_draft_group(str(root), "", attrs={"a_long": "x" * 200, **many})  # 13 keys, listed sorted
    a = create_draft_array(str(root), "g/a", shape=(4,), chunks=(2,), dtype="<i2", chunks_per_shard=(2,),
                           attrs={"units": "m"})
    a[...] = 1
    code, out, _ = run(capsys, "info", str(root))
    assert code == 0
    root_line = next(line for line in out.splitlines() if line.startswith("/  attributes "))
    shown = root_line[len("/  attributes "):]
    assert shown.startswith('a_long="' + "x" * 58 + "…, k00=0, ")  # the JSON value cut at 60 characters
    assert shown.endswith(", k06=6, … (+5 more)") and shown.count("=") == 8
    block = out.split("/g/a\n")[1]
    assert '  attributes units="m"' in block


def test_info_shows_hostile_attributes_escaped_on_one_line(tmp_path, capsys):
    """Attribute keys and values are a store's own text: a line break, a terminal escape or a
    bidi override in them is shown escaped on the node's one line, never written raw."""
    root = tmp_path / "hostile.zr3"
    create_draft_group(str(root), "", attrs={"a\nfake/  attributes x": "v\n/evil", "esc": "\x1b[2J", "rtl": "\u202etxt"})
    create_draft_group(str(root), "g", attrs={"who": "g"})
    code, out, _ = run(capsys, "info", str(root))
    assert code == 0
    lines = out.splitlines()
    root_line = next(line for line in lines if line.startswith("/  attributes "))
    assert '"a\\nfake/  attributes x"="v\\n/evil"' in root_line
    assert 'esc="\\u001b[2J"' in root_line and 'rtl="\\u202etxt"' in root_line
    assert "\x1b" not in out and "\u202e" not in out
    assert not any(line.startswith("fake/") for line in lines)
    assert '  g  attributes who="g"' in lines


def test_info_says_chunks_per_shard_not_shards(sharded, capsys):
    src, _ = sharded
    code, out, _ = run(capsys, "info", str(src))
    assert "big (192, 16) <i4 chunks (4, 8) chunks per shard (2, 2)" in out
    assert not re.search(r"\bshards \(", out)
    assert f"stored {N_SHARDS} shards" in out  # "shards" keeps meaning shard objects
