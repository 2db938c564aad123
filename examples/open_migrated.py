"""Open a migrated store with zarr-python 3 alone (no sharding-store) and print a slice."""

import sys

import numpy as np
import zarr

root = zarr.open_group(sys.argv[1], mode="r")
for path, arr in sorted(((a.path, a) for _, a in root.members(max_depth=None) if isinstance(a, zarr.Array))):
    codec = arr.metadata.codecs[0]
    kind = type(codec).__name__
    corner = tuple(slice(0, min(3, n)) for n in arr.shape)
    print(f"{path}: {arr.shape} {arr.dtype} chunks {arr.chunks} first codec {kind}")
    with np.printoptions(threshold=20, edgeitems=2, linewidth=100):
        print("  " + str(arr[corner]).replace("\n", "\n  "))
