"""Opening a store from a URL: setup mistakes are errors of ours naming the URL (issue 12 item 11)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sharding_store.errors import ShardingStoreError, UsageError
from sharding_store.stores import as_inner


def test_an_unknown_protocol_is_a_usage_error_naming_the_url():
    with pytest.raises(UsageError, match=r"nosuch://x/y: unknown protocol nosuch://") as info:
        as_inner("nosuch://x/y")
    assert info.value.exit_code == 2


def test_a_missing_backend_names_what_to_install():
    code = (
        "import sys; sys.modules['s3fs'] = None\n"
        "from sharding_store.stores import as_inner\n"
        "from sharding_store.errors import UsageError\n"
        "try:\n    as_inner('s3://bucket/x')\n"
        "except UsageError as e:\n    print(e.exit_code, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("2 s3://bucket/x: the s3:// protocol needs s3fs")
    assert "pip install 'sharding-store[s3]'" in out


def test_a_missing_backend_of_another_protocol_names_its_package():
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(UsageError, match="gs://b/x: the gs:// protocol needs gcsfs"):
            as_inner("gs://b/x")
    else:  # pragma: no cover - gcsfs installed
        pytest.skip("gcsfs is installed")


def test_something_that_is_no_store_is_refused():
    with pytest.raises(ShardingStoreError, match="cannot use int as a store"):
        as_inner(3)
