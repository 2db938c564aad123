"""ShardingStore against a plain dict model of chunk keys (hypothesis state machine).

The model is what an unsharded draft store would hold. After every step the wrapper
must agree with it, and every object under the array's data prefix must be a compact,
valid shard (no empty shards, no dead bytes).
"""

from __future__ import annotations

import itertools
import shutil
import tempfile

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from sharding_store import ShardingStore
from sharding_store.errors import ObjectChangedError
from sharding_store.formats.keys import format_chunk_suffix
from sharding_store.formats.shard_index import read_index

ARRAY = "group/arr"
PREFIX = f"data/root/{ARRAY}/"
PLAIN_KEYS = ["meta/root/other.json", "data/root/unsharded/c0", "attrs.json"]


class StoreMachine(RuleBasedStateMachine):
    backend = "dict"

    def make_inner(self):
        return {}

    @initialize(
        cps=st.lists(st.integers(1, 5), min_size=1, max_size=4),
        separator=st.sampled_from(["/", "."]),
    )
    def setup(self, cps, separator):
        self.cps = tuple(cps)
        self.sep = separator
        self.inner = self.make_inner()
        self.store = ShardingStore(self.inner, chunks_per_shard=self.cps, array_path=ARRAY, separator=separator)
        # a grid of up to two shards per dimension, at most ~64 chunks in all
        limits = [min(2 * n, max(1, 64 // (2 ** (len(cps) - 1)))) for n in self.cps]
        self.all_coords = list(itertools.product(*(range(min(lim, 4)) for lim in limits)))
        self.model: dict[str, bytes] = {}

    def key(self, coords):
        return PREFIX + format_chunk_suffix(coords, self.sep)

    def coords(self, data):
        return data.draw(st.sampled_from(self.all_coords))

    def keys(self, data, min_size=0):
        pool = [self.key(c) for c in self.all_coords] + PLAIN_KEYS
        return data.draw(st.lists(st.sampled_from(pool), unique=True, min_size=min_size, max_size=8))

    @rule(data=st.data(), value=st.binary(max_size=24))
    def set_chunk(self, data, value):
        key = self.key(self.coords(data))
        self.store[key] = value
        self.model[key] = value

    @rule(data=st.data(), value=st.binary(max_size=8))
    def set_plain(self, data, value):
        key = data.draw(st.sampled_from(PLAIN_KEYS))
        self.store[key] = value
        self.model[key] = value

    @rule(data=st.data())
    def get(self, data):
        key = self.key(self.coords(data))
        if key in self.model:
            assert self.store[key] == self.model[key]
            assert key in self.store
        else:
            with pytest.raises(KeyError):
                self.store[key]
            assert key not in self.store

    @rule(data=st.data())
    def delete(self, data):
        key = self.key(self.coords(data))
        if key in self.model:
            del self.store[key]
            del self.model[key]
        else:
            with pytest.raises(KeyError):
                del self.store[key]

    @rule(data=st.data())
    def update(self, data):
        keys = self.keys(data)
        values = {k: data.draw(st.binary(max_size=16)) for k in keys}
        self.store.update(values)
        self.model.update(values)

    @rule(data=st.data())
    def fill_whole_shard(self, data):
        """Every chunk of one shard at once: built without reading the old shard."""
        first = self.coords(data)
        shard = tuple(c // n for c, n in zip(first, self.cps))
        ranges = [range(s * n, (s + 1) * n) for s, n in zip(shard, self.cps)]
        values = {self.key(c): bytes([sum(c) % 256]) * (1 + sum(c) % 5) for c in itertools.product(*ranges)}
        self.store.update(values)
        self.model.update(values)

    @rule(data=st.data())
    def get_partial_values(self, data):
        keys = self.keys(data, min_size=1)
        ranges = [
            (k, (data.draw(st.integers(-30, 30)), data.draw(st.none() | st.integers(0, 30)))) for k in keys
        ]
        got = self.store.get_partial_values(ranges)
        for (k, (start, length)), value in zip(ranges, got):
            if k not in self.model:
                assert value is None
                continue
            full = self.model[k]
            lo = max(0, len(full) + start) if start < 0 else start
            hi = len(full) if length is None else lo + length
            assert value == full[lo:hi], (k, start, length)

    @rule(data=st.data())
    def set_partial_values(self, data):
        keys = self.keys(data, min_size=1)
        edits = [(k, data.draw(st.integers(0, 10)), data.draw(st.binary(max_size=6))) for k in keys]
        self.store.set_partial_values(edits)
        for k, start, value in edits:
            buf = bytearray(self.model.get(k, b""))
            if len(buf) < start:
                buf.extend(b"\0" * (start - len(buf)))
            buf[start : start + len(value)] = value
            self.model[k] = bytes(buf)

    @rule(data=st.data())
    def erase_values(self, data):
        keys = self.keys(data)
        self.store.erase_values(keys)
        for k in keys:
            self.model.pop(k, None)

    @rule(data=st.data())
    def erase_prefix(self, data):
        prefix = data.draw(st.sampled_from(self.prefixes(data)))
        self.store.erase_prefix(prefix)
        for k in [k for k in self.model if k.startswith(prefix)]:
            del self.model[k]

    def prefixes(self, data):
        c = self.coords(data)
        out = [PREFIX, PREFIX + "c", "data/root/unsharded/", "meta/"]
        if self.sep == "/" and len(c) > 1:
            out.append(PREFIX + format_chunk_suffix(c[:1], "/") + "/")
            out.append(PREFIX + format_chunk_suffix(c[:-1], "/") + "/")
        out.append(self.key(c))  # a full key is a prefix too (of itself, and c1 of c10...)
        return out

    @rule(data=st.data())
    def list_prefix(self, data):
        prefix = data.draw(st.sampled_from(self.prefixes(data) + ["", "data/root/"]))
        assert sorted(self.store.list_prefix(prefix)) == sorted(k for k in self.model if k.startswith(prefix))

    @rule(data=st.data())
    def list_dir(self, data):
        prefix = data.draw(st.sampled_from([p for p in self.prefixes(data) if p.endswith("/")] + ["", "data/root/"]))
        keys, prefixes = self.store.list_dir(prefix)
        under = [k[len(prefix) :] for k in self.model if k.startswith(prefix)]
        assert sorted(keys) == sorted(prefix + r for r in under if "/" not in r)
        expected_prefixes = {prefix + r.split("/")[0] + "/" for r in under if "/" in r}
        assert expected_prefixes <= set(prefixes)
        # extra prefixes are allowed only for chunk rows of shards that exist (spec note)
        for p in set(prefixes) - expected_prefixes:
            assert p.startswith(PREFIX), p
            row = int(p[len(prefix) :].lstrip("c").rstrip("/"))
            depth = p[len(PREFIX) :].count("/") - 1
            n = self.cps[depth]
            assert any(
                k.startswith(PREFIX) and self._coord(k, depth) // n == row // n for k in self.model
            ), (p, sorted(self.model))

    def _coord(self, key, depth):
        return int(key[len(PREFIX) + 1 :].split(self.sep)[depth])

    @invariant()
    def agrees_with_model(self):
        if not hasattr(self, "model"):
            return
        assert sorted(self.store) == sorted(self.model)
        assert len(self.store) == len(self.model)

    @invariant()
    def shards_are_compact(self):
        if not hasattr(self, "model"):
            return
        for key in self.inner_keys():
            if not key.startswith(PREFIX):
                continue
            blob = self.inner_get(key)
            index = read_index(blob, self.cps, key=key)
            assert not index.is_empty(), f"{key}: an empty shard should have been deleted"
            assert index.is_compact(len(blob)), f"{key}: dead bytes"

    def inner_keys(self):
        return list(self.inner)

    def inner_get(self, key):
        return self.inner[key]


class LocalStoreMachine(StoreMachine):
    """The same rules over a local directory opened through fsspec (a path string)."""

    def make_inner(self):
        if hasattr(self, "_dir"):
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = tempfile.mkdtemp(prefix="sharding-store-model-")
        return self._dir

    def inner_keys(self):
        return list(self.store.inner.list_prefix(""))

    def inner_get(self, key):
        return self.store.inner.get(key)

    def teardown(self):
        shutil.rmtree(getattr(self, "_dir", ""), ignore_errors=True)


_settings = dict(stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TestStoreOverDict = StoreMachine.TestCase
TestStoreOverDict.settings = settings(max_examples=60, **_settings)
TestStoreOverDict.pytestmark = [pytest.mark.slow]  # slow: both store machines (engine tests stay fast)
TestStoreOverLocalDirectory = LocalStoreMachine.TestCase
TestStoreOverLocalDirectory.settings = settings(max_examples=20, **_settings)
TestStoreOverLocalDirectory.pytestmark = [pytest.mark.slow]


# ---------------------------------------------------------------------- the stores themselves

STORE_KEYS = ["a", "a/b", "a/b/c", "a/bc", "a.b", "ab/c/d", "z", "a/b/c/d/e"]
STORE_PREFIXES = ["", "a", "a/", "a/b", "a/b/", "ab/", "z", "q/"]


class InnerMachine(RuleBasedStateMachine):
    """A store (``Inner``) against a dict model: core methods and every capability.

    A key that is a "directory" of another (``a/b`` and ``a/b/c``) cannot coexist on a
    filesystem, so writes that would need it are skipped, for every backend alike.
    """

    backend = "mapping"

    def make_store(self):
        from sharding_store.stores import MappingInner

        return MappingInner({})

    @initialize()
    def setup(self):
        self.inner = self.make_store()
        self.model: dict[str, bytes] = {}

    def teardown(self):
        shutil.rmtree(getattr(self, "_dir", ""), ignore_errors=True)

    def _clashes(self, key):
        return any(k != key and (k.startswith(key + "/") or key.startswith(k + "/")) for k in self.model)

    @rule(key=st.sampled_from(STORE_KEYS), value=st.binary(max_size=20))
    def set(self, key, value):
        if self._clashes(key):
            return
        self.inner.set(key, value)
        self.model[key] = value

    @rule(key=st.sampled_from(STORE_KEYS), value=st.binary(max_size=8))
    def create_exclusive(self, key, value):
        if self._clashes(key):
            return
        created = self.inner.create_exclusive(key, value)
        assert created == (key not in self.model)
        self.model.setdefault(key, value)

    @rule(key=st.sampled_from(STORE_KEYS))
    def delete(self, key):
        self.inner.delete(key)
        self.model.pop(key, None)

    @rule(prefix=st.sampled_from(STORE_PREFIXES))
    def delete_prefix(self, prefix):
        self.inner.delete_prefix(prefix)
        for k in [k for k in self.model if k.startswith(prefix)]:
            del self.model[k]

    @rule(src=st.sampled_from(STORE_KEYS), dst=st.sampled_from(STORE_KEYS))
    def move(self, src, dst):
        if src not in self.model or src == dst or src.startswith(dst + "/") or dst.startswith(src + "/") or any(
            k not in (src, dst) and (k.startswith(dst + "/") or dst.startswith(k + "/")) for k in self.model
        ):
            return
        self.inner.move(src, dst)
        self.model[dst] = self.model.pop(src)

    @rule(src=st.sampled_from(STORE_KEYS), dst=st.sampled_from(STORE_KEYS), append=st.binary(max_size=4))
    def copy_within(self, src, dst, append):
        """copy_to into the same store, or its caller's fallback (read + write)."""
        if src not in self.model or self._clashes(dst):
            return
        if not self.inner.copy_to(src, self.inner, dst, append=append):
            self.inner.set(dst, self.inner.get(src) + append)
        self.model[dst] = self.model[src] + append

    @rule(key=st.sampled_from(STORE_KEYS), n=st.integers(0, 30))
    def get_and_tails(self, key, n):
        assert self.inner.get(key) == self.model.get(key)
        assert self.inner.exists(key) == (key in self.model)
        assert self.inner.size(key) == (len(self.model[key]) if key in self.model else None)
        tail = self.inner.get_tails([(key, n)])[0]
        if key not in self.model:
            assert tail is None
            return
        value = self.model[key]
        assert tail.data == value[max(0, len(value) - n) :]
        assert tail.size in (None, len(value))
        got = self.inner.read_into(key, bytearray)
        assert bytes(got.data) == value and got.size == len(value)

    @rule(
        key=st.sampled_from(STORE_KEYS),
        ranges=st.lists(st.tuples(st.integers(-25, 25), st.none() | st.integers(0, 25)), min_size=1, max_size=4),
        versioned=st.booleans(),
    )
    def get_ranges(self, key, ranges, versioned):
        requests = [(key, s, None if s < 0 else e) for s, e in ranges]
        tail = self.inner.get_tails([(key, 8)])[0]
        versions = [tail.version if tail else None] * len(requests) if versioned else None
        got = self.inner.get_ranges(requests, versions) if versioned else self.inner.get_ranges(requests)
        for (_, s, e), value in zip(requests, got):
            if key not in self.model:
                assert value is None
                continue
            full = self.model[key]
            assert value == (full[max(0, len(full) + s) :] if s < 0 else full[s:e]), (s, e)

    @rule(key=st.sampled_from(STORE_KEYS), value=st.binary(min_size=1, max_size=8))
    def stale_version_is_refused(self, key, value):
        if key not in self.model or self._clashes(key):
            return
        tail = self.inner.get_tails([(key, 4)])[0]
        if tail.version is None:
            return  # a backend without versions (documented)
        new = self.model[key] + value  # another size: a different version for every backend
        self.inner.set(key, new)
        self.model[key] = new
        with pytest.raises(ObjectChangedError):
            self.inner.get_ranges([(key, 0, 1)], [tail.version])

    @rule(prefix=st.sampled_from(STORE_PREFIXES))
    def listings(self, prefix):
        expected = sorted(k for k in self.model if k.startswith(prefix))
        assert list(self.inner.list_prefix(prefix)) == expected
        sized = list(self.inner.list_sized(prefix))
        assert [k for k, _ in sized] == expected
        assert all(n in (None, len(self.model[k])) for k, n in sized)
        if prefix == "" or prefix.endswith("/"):
            keys, prefixes = self.inner.list_dir(prefix)
            under = [k[len(prefix) :] for k in expected]
            assert keys == sorted(prefix + r for r in under if "/" not in r)
            assert prefixes == sorted({prefix + r.split("/")[0] + "/" for r in under if "/" in r})

    @invariant()
    def agrees(self):
        if hasattr(self, "model"):
            assert {k: self.inner.get(k) for k in self.inner.list_prefix("")} == self.model
            assert self.inner.location().relation(self.inner.location()) == "same"
            assert isinstance(self.inner.describe(), str)


class LocalInnerMachine(InnerMachine):
    backend = "local"

    def make_store(self):
        from sharding_store.stores import LocalInner

        shutil.rmtree(getattr(self, "_dir", ""), ignore_errors=True)
        self._dir = tempfile.mkdtemp(prefix="sharding-store-inner-")
        return LocalInner(self._dir)


class MemoryFsInnerMachine(InnerMachine):
    backend = "memory"

    def make_store(self):
        import uuid

        from sharding_store.stores import FsspecInner, as_inner

        inner = as_inner(f"memory://model-{uuid.uuid4().hex}")
        assert isinstance(inner, FsspecInner)
        return inner


class CountingLocalInnerMachine(LocalInnerMachine):
    """Through the counting wrapper: every capability delegated, same answers."""

    backend = "counting"

    def make_store(self):
        from sharding_store.testing import CountingInner

        return CountingInner(super().make_store())


_inner_settings = settings(max_examples=100, stateful_step_count=30, deadline=None,
                           suppress_health_check=[HealthCheck.too_slow])
TestMappingInner = InnerMachine.TestCase
TestMappingInner.settings = _inner_settings
TestMappingInner.pytestmark = [pytest.mark.slow]  # slow: the inner machines but the fsspec one
TestLocalInner = LocalInnerMachine.TestCase
TestLocalInner.settings = _inner_settings
TestLocalInner.pytestmark = [pytest.mark.slow]
TestMemoryFsInner = MemoryFsInnerMachine.TestCase
TestMemoryFsInner.settings = _inner_settings
TestCountingLocalInner = CountingLocalInnerMachine.TestCase
TestCountingLocalInner.settings = _inner_settings
TestCountingLocalInner.pytestmark = [pytest.mark.slow]
