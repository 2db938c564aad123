"""A forked child can read (issue 12 item 13, issue 13 item 4).

The process-wide decode pool of ``sharding_store.api.arrays`` exists after the parent's first big
read; a child forked then inherits the pool object but none of its threads, so work handed
to it waited forever (6befc1a hung here). The child now makes its own pool, and the engine's
locks are fresh in it. The test bounds the child's time so that it fails rather than hangs.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from sharding_store.api.arrays import create_draft_array, open_draft

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
TIMEOUT = 60.0


def _wait(pid: int) -> int:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child did not finish its read within {TIMEOUT:.0f} s (hung)")


@pytest.mark.parametrize("reuse", [False, True], ids=["new-array", "parent-array"])
def test_a_forked_child_completes_a_full_read(tmp_path, reuse):
    data = (np.arange(512 * 512, dtype="<u4").reshape(512, 512) % 65521).astype("<u2")
    a = create_draft_array(str(tmp_path), "a", shape=data.shape, chunks=(32, 32), dtype="<u2", chunks_per_shard=(4, 4))
    a[...] = data
    parent = open_draft(str(tmp_path), "a")
    assert np.array_equal(parent[...], data)  # 256 chunks in 16 shards: decoded on the pool
    assert np.array_equal(parent[::3, 5:400], data[::3, 5:400])
    pid = os.fork()
    if pid == 0:  # the child: exit status only, never return into pytest
        code = 3
        try:
            child = parent if reuse else open_draft(str(tmp_path), "a")
            code = 0 if np.array_equal(child[...], data) and np.array_equal(child[::3, 5:400], data[::3, 5:400]) else 1
        except BaseException:  # noqa: BLE001
            code = 2
        finally:
            os._exit(code)
    assert _wait(pid) == 0
    assert np.array_equal(parent[...], data)  # and the parent's pool still works
