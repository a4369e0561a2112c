"""What tests, benchmarks and the demo use, and the installed package never does: the simulated
fleet (simulate.py). It lives outside the `slurmhealth` package so that no install carries it;
it may import slurmhealth, slurmhealth never imports it (tests/test_layout.py)."""
