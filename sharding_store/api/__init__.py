"""Layer 5: what users open: hierarchies, numpy arrays, the ``ShardingStore`` mapping,
the zarr-python 3 view, the per-array evidence ``info`` shows."""
