"""stores._obstore: one obstore client per process for a bucket and its settings (building one
loads the system's TLS roots, most of a cold open's client time), never one shared between
different credentials, endpoints or buckets. No server needed: building a client sends nothing."""

from __future__ import annotations

import os

import pytest

from sharding_store.stores import ObstoreInner, _obstore, as_inner

pytest.importorskip("s3fs")
pytest.importorskip("obstore")


def _options(key: str = "k1", port: int = 9, region: str = "us-east-1") -> dict:
    return {"key": key, "secret": "s", "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": region}}


@pytest.fixture(autouse=True)
def _plain_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)


def _inner(url: str, options: dict) -> ObstoreInner:
    inner = as_inner(url, storage_options=options)
    assert isinstance(inner, ObstoreInner)
    return inner


def test_stores_with_the_same_settings_share_one_client() -> None:
    a = _inner("s3://bkt/one.zr", _options())
    b = _inner("s3://bkt/other/two.zr", _options())  # another prefix of the bucket: same client
    assert a.client() is b.client()


def test_calls_build_one_client_per_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    import obstore.store

    built: list[str] = []
    real = obstore.store.S3Store

    def counting(bucket: str, **kw: object) -> object:
        built.append(bucket)
        return real(bucket, **kw)

    monkeypatch.setattr(obstore.store, "S3Store", counting)
    monkeypatch.setattr(_obstore, "_CLIENTS", {})
    for _ in range(3):
        _inner("s3://bkt/one.zr", _options()).client()
    assert built == ["bkt"]


@pytest.mark.parametrize("other", [
    ("s3://bkt/one.zr", _options(key="k2")),  # other credentials
    ("s3://bkt/one.zr", _options(port=10)),  # another endpoint
    ("s3://bkt/one.zr", _options(region="eu-west-1")),
    ("s3://bkt2/one.zr", _options()),  # another bucket
])
def test_different_settings_never_share_a_client(other: tuple[str, dict]) -> None:
    a = _inner("s3://bkt/one.zr", _options())
    b = _inner(*other)
    assert a.client() is not b.client()
    assert b.settings != a.settings


def test_clients_kept_are_bounded_least_recently_used_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process renewing its session token does not keep a client per token it ever had."""
    monkeypatch.setattr(_obstore, "_CLIENTS", {})
    first = _inner("s3://bkt/one.zr", _options(key="k-first")).client()
    for i in range(3 * _obstore.MAX_CLIENTS):
        _inner("s3://bkt/one.zr", _options(key=f"k{i}")).client()
        assert _inner("s3://bkt/one.zr", _options(key="k-first")).client() is first  # in use: kept
    assert len(_obstore._CLIENTS) == _obstore.MAX_CLIENTS
    newest = _inner("s3://bkt/one.zr", _options(key=f"k{3 * _obstore.MAX_CLIENTS - 1}")).client()
    assert sum(c is newest for c in _obstore._CLIENTS.values()) == 1
