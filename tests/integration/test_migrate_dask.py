"""Work units on a dask cluster (separate processes): same output as the thread pool."""

from __future__ import annotations

import pytest

from sharding_store import UsageError
from sharding_store.cli import main
from sharding_store.ops.migration import migrate
from tests.draft_factory import make_big_array, make_hierarchy, read_v3, tree_bytes

distributed = pytest.importorskip("distributed")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")]  # slow: dask clusters


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, silence_logs=40) as c:
        yield c


@pytest.fixture
def src(tmp_path):
    values = make_hierarchy(tmp_path / "src")
    values["big"] = make_big_array(tmp_path / "src", shards=12)
    return tmp_path / "src", values


def test_executor_runs_units_in_worker_processes(cluster, src, tmp_path):
    path, values = src
    with distributed.Client(cluster) as client:
        report = migrate(str(path), str(tmp_path / "dask"), executor=client.get_executor(), jobs=2, progress=False)
        workers = client.run(lambda: __import__("os").getpid())
    assert len(set(workers.values())) == 2
    assert report.verification.ok and report.totals.written + report.totals.copied == report.shards
    migrate(path, tmp_path / "threads", progress=False)
    assert tree_bytes(tmp_path / "dask") == tree_bytes(tmp_path / "threads")
    for p, expected in values.items():
        assert (read_v3(tmp_path / "dask", p) == expected).all()


def test_cli_scheduler_option(cluster, src, tmp_path, capsys):
    path, _ = src
    assert main(["migrate", str(path), str(tmp_path / "out"), "--scheduler", cluster.scheduler_address, "--json"]) == 0
    assert '"ok": true' in capsys.readouterr().out
    assert main(["verify", str(path), str(tmp_path / "out"), "--scheduler", cluster.scheduler_address]) == 0


def test_store_objects_cannot_go_to_other_processes(cluster, src):
    path, _ = src
    with distributed.Client(cluster) as client, pytest.raises(UsageError, match="URL"):
        migrate(str(path), {}, executor=client.get_executor())
