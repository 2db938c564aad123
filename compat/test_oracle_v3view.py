"""The zarr-3 view (``open_v3``) against zarr-python 2.18.7, the legacy oracle.

Every array 2.18 reads from the legacy corpus and from the 47 zarr-js fixtures must
read identically through zarr-python 3 over :class:`~sharding_store.api.v3view.DraftV3Store`
(values and shape; byte order aside, since zarr 3 hands out native-endian arrays).
An array the view cannot offer must fail with a DraftMetadataError that names it,
never with other data; an array 2.18 itself cannot read must not read here either.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from compat import oracle
from compat.oracle import arrays_equal
from sharding_store.api.v3view import open_v3
from sharding_store.errors import DraftMetadataError
from tests.fixtures import ZARR_JS, require

pytestmark = [
    pytest.mark.legacy,
    pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning"),
]

FIXTURES = ZARR_JS

#: Cases whose arrays zarr 3 cannot (all) offer: the ``|O`` array's metadata is refused
#: by the draft parser (which fails the whole hierarchy walk), and zarr 3 cannot read a
#: sharded structured array. Anything else refused is a regression.
MAY_REFUSE = {"odd_dtypes"}


def _native(a: np.ndarray) -> np.ndarray:
    """zarr 3 returns native byte order; compare values, not byte order."""
    if a.dtype.fields is None and a.dtype.byteorder not in ("=", "|"):
        return a.astype(a.dtype.newbyteorder("="))
    return a


def _check_store(store: Path, dump: oracle.LegacyDump, case: str) -> list[str]:
    """Compare every array of one store; the paths the view refused."""
    refused = []
    for path in sorted(set(dump.arrays) | set(dump.errors)):
        where = f"{case}:{path or '<root>'}"
        if path in dump.errors:  # 2.18 cannot read it (e.g. the resize defect): nor may we
            with pytest.raises(Exception):
                open_v3(str(store), path)[...]
            continue
        try:
            got = open_v3(str(store), path)[...]
        except DraftMetadataError as e:
            assert "array.json" in str(e), where  # names an array document
            refused.append(path)
            continue
        want = _native(dump.arrays[path])
        assert arrays_equal(got, want), f"{where}: {got!r} != {want!r}"
    return refused


@pytest.fixture(scope="module")
def corpus_dumps(legacy_corpus) -> dict[str, tuple[Path, oracle.LegacyDump]]:
    stores = oracle.corpus_stores(legacy_corpus)
    dumps = oracle.legacy_dump_many(stores.values(), chunks=False)
    return {name: (s, dumps[Path(s).resolve()]) for name, s in stores.items()}


def test_corpus_reads_like_legacy(corpus_dumps) -> None:
    refused = {}
    for case, (store, dump) in corpus_dumps.items():
        r = _check_store(store, dump, case)
        if r:
            refused[case] = r
    assert set(refused) <= MAY_REFUSE, refused


def test_corpus_matches_generator_values(legacy_corpus) -> None:
    """And the values the corpus generator meant to write (not read back through zarr)."""
    checked = 0
    for a in oracle.corpus_arrays(legacy_corpus):
        if a.case in MAY_REFUSE or a.entry.get("legacy_defect"):
            continue
        got = open_v3(str(a.store), a.path)[...]
        assert arrays_equal(got, _native(a.expected())), a.id
        checked += 1
    assert checked > 70


def test_odd_dtypes_never_give_wrong_data(corpus_dumps) -> None:
    """Whatever the view refuses there, it refuses with an error naming an array."""
    store, dump = corpus_dumps["odd_dtypes"]
    for path in dump.arrays:
        try:
            got = open_v3(str(store), path)[...]
        except DraftMetadataError as e:
            assert "meta/root/" in str(e) and ".array.json" in str(e)
        else:
            assert arrays_equal(got, _native(dump.arrays[path])), path


def test_zarr_js_fixtures_read_like_legacy() -> None:
    stores = sorted(require(FIXTURES).glob("*.zarr"))
    assert len(stores) == 47
    dumps = oracle.legacy_dump_many(stores, chunks=False)
    for store in stores:
        dump = dumps[store.resolve()]
        dump.assert_ok()
        assert _check_store(store, dump, store.name) == []
