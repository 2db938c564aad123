"""Layers 0 and 3: the one native door (``_native``: ctypes, raw addresses, the optional
``_loops`` library) and chunk payload <-> ndarray."""
