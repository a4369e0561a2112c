"""Shared by every layer: the Result contract, names, host lists, times, the Slurm adapter, the
store and the safety limits. Standard library only, imports nothing above it."""
