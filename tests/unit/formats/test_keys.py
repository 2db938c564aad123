"""Draft chunk keys parsed by one regular expression (``formats.keys.chunk_key_pattern``):
the same keys accepted, with the same coordinates, as the rule spelled out part by part."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sharding_store.engine.shard_engine import ArrayLayout
from sharding_store.formats.keys import chunk_key_pattern, parse_chunk_suffix


def _by_parts(suffix: str, separator: str, ndim: int) -> tuple[int, ...] | None:
    """The rule as the parser spelled it before: ``c``, then ``ndim`` parts of plain ASCII
    decimal digits without a leading zero."""
    if not suffix.startswith("c"):
        return None
    if ndim == 0:
        return () if suffix[1:] in ("", "0") else None
    parts = suffix[1:].split(separator)
    if len(parts) != ndim:
        return None
    if any(not p.isascii() or not p.isdigit() or (len(p) > 1 and p[0] == "0") for p in parts):
        return None
    return tuple(int(p) for p in parts)


_PIECES = st.sampled_from(["c", "0", "1", "7", "10", "01", "/", ".", "-1", "+1", " 1", "٣", "²", "x", "\n", "00"])


@settings(max_examples=400, deadline=None)
@given(st.lists(_PIECES, max_size=8).map("".join), st.sampled_from(["/", "."]), st.integers(0, 4))
def test_a_suffix_parses_as_the_rule_spelled_out_says(suffix, separator, ndim):
    assert parse_chunk_suffix(suffix, separator, ndim) == _by_parts(suffix, separator, ndim)


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, max_size=8).map("".join), st.sampled_from(["/", "."]), st.integers(0, 3),
       st.sampled_from(["data/root/a/", "data/root/", "data/root/a.b+c(d)/", "data/root/x/y/"]))
def test_a_layouts_whole_key_parses_as_its_suffix(suffix, separator, ndim, prefix):
    """``ArrayLayout.parse`` of a draft key: its prefix (regular-expression characters in it
    taken literally), then the suffix's rule; any other key is not the array's."""
    layout = ArrayLayout("a", prefix, ndim, separator, None)
    assert layout.parse(prefix + suffix) == _by_parts(suffix, separator, ndim)
    assert layout.parse("data/root/other/" + suffix) is None


def test_the_pattern_is_compiled_once_per_array():
    assert chunk_key_pattern("/", 3, "data/root/a/") is chunk_key_pattern("/", 3, "data/root/a/")
    assert chunk_key_pattern("/", 3, "data/root/a/").fullmatch("data/root/a/c1/20/3").groups() == ("1", "20", "3")
