"""Layer 1: the pure format modules (no I/O): keys, shard index, one reader per draft
generation, the v3 documents, the journals."""
