"""Layer 4: the shard engine (index reads, consistent reads, coalescing, rewrites)."""
