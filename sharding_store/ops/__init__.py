"""Layers 6 and 7: the operations (migrate, upgrade in place, verify, reshard), their
typed options, the jobs that run them and their progress."""
