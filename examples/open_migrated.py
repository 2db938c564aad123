"""Open a migrated store with zarr-python 3 and compare every array with the draft source.

usage: python examples/open_migrated.py DRAFT_SRC MIGRATED_DST
"""

import sys
import warnings

import numpy as np
import zarr

import sharding_store

# zarr-python warns that numcodecs.* codecs are zarr-python-only; `info` already said which
warnings.filterwarnings("ignore", message="Numcodecs codecs are not in the Zarr version 3 specification")

src, dst = sys.argv[1], sys.argv[2]
root = zarr.open_group(dst, mode="r")
arrays = sorted((a.path, a) for _, a in root.members(max_depth=None) if isinstance(a, zarr.Array))
mismatches = 0
for path, arr in arrays:
    same = np.array_equal(arr[...], sharding_store.open_draft(src, path)[...], equal_nan=arr.dtype.kind == "f")
    mismatches += not same
    sharded = type(arr.metadata.codecs[0]).__name__ == "ShardingCodec"
    layout = f"shards {arr.shards}" if sharded else "unsharded"
    print(f"  {path:<22} {str(arr.shape):<16} {str(arr.dtype):<15} {layout:<22} {'equal to source' if same else 'DIFFERS'}")
path, arr = max(arrays, key=lambda pa: pa[1].nbytes)  # show a slice of the largest array
corner = (0,) * (arr.ndim - 2) + (slice(0, 3), slice(0, 6))
lead = ", ".join(map(str, corner[:-2])) + (", " if arr.ndim > 2 else "")
print(f"zarr-python {zarr.__version__} reads {len(arrays)} arrays; {path}[{lead}:3, :6] =")
print("  " + str(arr[corner]).replace("\n", "\n  "))
sys.exit(1 if mismatches else 0)
