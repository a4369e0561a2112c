"""Deep diagnostics run on a node (slurmhealth diagnose): probes, their parsers, the built-in
GPU tests."""
