"""The units a virtual migration logs for the reference check after it (``ops.units.UnitLog``)."""

from __future__ import annotations

import pickle

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


def test_the_log_gives_back_the_units_it_took_as_named_tuples():
    units = _units(2 * LOG_BATCH + 5)
    log = UnitLog()
    log.begin("a")
    for unit in units:
        log.add(unit)
    log.end("a")
    log.begin("b")  # another array's units, not listed whole: not given
    log.add(units[0])
    try:
        back = list(log.units("a"))
        assert back == units and log.units("b") is None
        assert all(type(u) is Unit and all(type(s) is Source for s in u.sources) for u in back)
        assert [u.sources[-1].key for u in back] == [u.sources[-1].key for u in units]
        assert [(u.target, u.dst_size, u.dst_sizes) for u in back] == [(u.target, u.dst_size, u.dst_sizes)
                                                                      for u in units]
    finally:
        log.close()


def test_the_log_pickles_plain_tuples():
    """A named tuple is pickled through a Python-level call per object (its
    ``__getnewargs__``): half the log's cost. The file holds plain tuples only."""
    log = UnitLog()
    log.begin("a")
    for unit in _units(10):
        log.add(unit)
    log.end("a")
    try:
        log._file.seek(0)
        batch = pickle.load(log._file)  # noqa: S301 - the test's own file
        assert len(batch) == 10
        assert all(type(u) is tuple and all(type(s) is tuple for s in u[0]) for u in batch), batch[:2]
    finally:
        log.close()
