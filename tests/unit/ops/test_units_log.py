"""The units a virtual migration logs for the reference check after it (``ops.units.UnitLog``)."""

from __future__ import annotations

import pickle

import pytest

from sharding_store.ops.jobs import Source
from sharding_store.ops.units import LOG_BATCH, Unit, UnitLog


def _units(n: int) -> list[Unit]:
    out = []
    for i in range(n):
        one = Source((i, 0), f"data/root/a/c{i}/0", 100 + i)
        if i % 3 == 0:  # an unsharded target's unit: several chunk objects, some found in the destination
            two = Source((i, 1), f"data/root/a/c{i}/1", None)
            out.append(Unit((one, two), None, None, (None, 7)))
        else:
            out.append(Unit((one,), (i, 0), 5 if i % 3 == 1 else None))
    return out


def _shards(n: int) -> list[Unit]:
    """Units of one source object each (a shard of a sharded array: the usual)."""
    return [Unit((Source((i, 1), f"data/root/a/c{i}/1", 100 + i),), (i, 1), 5 if i % 2 else None,
                 (None,) if i % 5 == 0 else None) for i in range(n)]


def _plain_only(value: object) -> bool:
    """Whether ``value`` holds no tuple but plain ones (no named tuple), at any depth."""
    if isinstance(value, tuple):
        return type(value) is tuple and all(map(_plain_only, value))
    if isinstance(value, list):
        return all(map(_plain_only, value))
    return True


@pytest.mark.parametrize("make", [_units, _shards, lambda n: _shards(n // 2) + _units(n - n // 2)],
                         ids=["mixed", "one-source-each", "batches-of-both-kinds"])
def test_the_log_gives_back_the_units_it_took(make):
    units = make(2 * LOG_BATCH + 5)
    log = UnitLog()
    log.begin("a")
    for unit in units:
        log.add(unit)
    log.end("a")
    log.begin("b")  # another array's units, not listed whole: not given
    log.add(units[0])
    try:
        back = [tuple(u) for u in log.units("a")]  # (zip reuses a row its reader let go)
        assert back == units and log.units("b") is None
        assert all(_plain_only(u) for u in back)  # read by index, as the check reads them
        assert [u[0][-1][1] for u in back] == [u.sources[-1].key for u in units]
        assert [u[1:] for u in back] == [(u.target, u.dst_size, u.dst_sizes) for u in units]
    finally:
        log.close()


def _batches(log: UnitLog) -> list[tuple[bytes, object]]:
    """``(tag, batch)`` of every batch the log wrote, read from its file as it is laid out."""
    import marshal

    log._file.seek(0)
    raw, out = log._file.read(), []
    while raw:
        n = int.from_bytes(raw[1:9], "little")
        tag, data, raw = raw[:1], raw[9 : 9 + n], raw[9 + n :]
        out.append((tag, marshal.loads(data) if tag == b"m" else pickle.loads(data)))  # noqa: S301 - the test's own
    return out


@pytest.mark.parametrize("make", [_units, _shards], ids=["rows", "columns"])
def test_the_log_writes_plain_tuples_with_marshal(make):
    """A named tuple is pickled through a Python-level call per object (its
    ``__getnewargs__``), and marshal takes none: the file holds plain tuples only, a batch
    of one-source units as columns (taken apart without a Python step a unit)."""
    log = UnitLog()
    log.begin("a")
    for unit in make(10):
        log.add(unit)
    log.end("a")
    try:
        [(tag, batch)] = _batches(log)
        assert tag == b"m" and _plain_only(batch), batch
        assert batch[0] is (make is _shards) and len(batch[1]) == 10
    finally:
        log.close()


class Coord(tuple):  # noqa: SLOT001 - a stand-in for any value marshal refuses (pickle takes it)
    pass


def test_a_batch_marshal_refuses_is_pickled_and_read_back():
    """A value of a type marshal does not take (here a coordinate of a tuple subclass): that
    batch is pickled, the others still marshalled, and all come back in order."""

    units = _shards(3 * LOG_BATCH)
    odd = LOG_BATCH + 1
    units[odd] = units[odd]._replace(target=Coord(units[odd].target))
    log = UnitLog()
    log.begin("a")
    for unit in units:
        log.add(unit)
    log.end("a")
    try:
        assert [tag for tag, _ in _batches(log)] == [b"m", b"p", b"m"]
        assert [tuple(u) for u in log.units("a")] == units
    finally:
        log.close()
