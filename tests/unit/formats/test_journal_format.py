"""The reshard journal document (sharding_store.formats.reshard_journal): key, encoding, parsing, and
what a store with an unreadable journal does to the commands."""

from __future__ import annotations

import json

import pytest

from sharding_store import create_draft_array
from sharding_store.cli import main
from sharding_store.errors import MigrationError
from sharding_store.formats import draft_metadata as dm
from sharding_store.formats.reshard_journal import (
    JOURNAL_PREFIX,
    Journal,
    interrupted_error,
    interrupted_reshards,
    journal_key,
    refuse_interrupted_reshards,
)
from sharding_store.stores import as_inner
from sharding_store.testing import CountingInner


def sample(phase: str = "swap") -> Journal:
    meta = create_draft_array({}, "a/b", shape=(4,), chunks=(2,), dtype="u1", chunks_per_shard=2).meta
    doc = dm.encode_array_metadata(meta).decode()
    return Journal(path="a/b", meta_key=dm.array_meta_key("a/b"), old=doc, new=doc, phase=phase, consolidated=False)


def test_round_trip_and_key():
    j = sample()
    assert j.key == journal_key("meta/root/a/b.array.json") == JOURNAL_PREFIX + "meta/root/a/b.array.json"
    assert Journal.parse(j.encode(), j.key) == j
    old, new = j.metas()
    assert old.path == new.path == "a/b" and old.chunks_per_shard == (2,)
    assert j.hides_array and not sample("stage").hides_array
    assert j.to_json() == {"path": "a/b", "phase": "swap", "journal": j.key, "hidden": True}


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda d: b"{not json", "unreadable reshard journal"),
        (lambda d: b"[1, 2]", "unreadable reshard journal"),
        (lambda d: json.dumps({**d, "extra": 1}).encode(), "unreadable reshard journal"),
        (lambda d: json.dumps({**d, "phase": "dance"}).encode(), "phase 'dance'"),
        (lambda d: json.dumps({**d, "version": 2}).encode(), "version 2"),
        (lambda d: json.dumps({**d, "old": 5}).encode(), "field 'old' has the wrong type"),
        (lambda d: json.dumps({**d, "meta_key": "meta/root/x.array.json"}).encode(), "describes"),
        (lambda d: b"[" * 100_000, "unreadable reshard journal"),
    ],
    ids=["not-json", "not-object", "unknown-field", "phase", "version", "type", "other-array", "deep"],
)
def test_damaged_journal_is_named(edit, match):
    j = sample()
    raw = edit(json.loads(j.encode()))
    with pytest.raises(MigrationError, match=match) as e:
        Journal.parse(raw, j.key)
    assert e.value.key == j.key and e.value.exit_code == 10


def test_listing_costs_one_request_when_there_is_no_journal(tmp_path):
    create_draft_array(str(tmp_path), "a", shape=(4,), chunks=(2,), dtype="u1")
    counting = CountingInner(as_inner(str(tmp_path)))
    refuse_interrupted_reshards(counting, str(tmp_path))
    assert counting.calls["list_prefix"] == 1 and counting.reads == 0


def test_error_names_every_array_and_the_command():
    js = [sample(), Journal(**{**vars(sample("stage")), "path": "c", "meta_key": "meta/root/c.array.json"})]
    e = interrupted_error(js, "s3://b/x")
    text = str(e)
    assert "reshards of array 'a/b' (phase swap" in text and "array 'c' (phase stage" in text
    assert "`sharding-store reshard s3://b/x --resume`" in text and e.key == js[0].key


def test_unreadable_journal_fails_info_strict_and_migrate(tmp_path, capsys):
    src = tmp_path / "src"
    create_draft_array(str(src), "a", shape=(4,), chunks=(2,), dtype="u1")[...] = 1
    key = src / JOURNAL_PREFIX / "meta/root/a.array.json"
    key.parent.mkdir(parents=True)
    key.write_bytes(b"garbage")
    assert main(["migrate", str(src), str(tmp_path / "out")]) == 10
    assert "unreadable reshard journal" in capsys.readouterr().err
    assert main(["info", str(src), "--strict"]) == 10
    inner = as_inner(str(src))
    with pytest.raises(MigrationError):
        interrupted_reshards(inner)


def test_info_reports_an_unreadable_journal_and_carries_on(tmp_path, capsys):
    src = tmp_path / "src"
    create_draft_array(str(src), "a", shape=(4,), chunks=(2,), dtype="u1")[...] = 1
    key = src / JOURNAL_PREFIX / "meta/root/b.array.json"
    key.parent.mkdir(parents=True)
    key.write_bytes(b"{")
    assert main(["info", str(src)]) == 0
    out = capsys.readouterr().out
    assert "/a" in out and "damaged reshard journal" in out and "__reshard__/journal/meta/root/b.array.json" in out
    assert main(["info", str(src), "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["interrupted_reshards"]
    assert entry["journal"] == "__reshard__/journal/meta/root/b.array.json" and entry["error"] == "MigrationError"
    assert main(["ls", str(src)]) == 0
    assert "damaged-reshard-journal" in capsys.readouterr().out
