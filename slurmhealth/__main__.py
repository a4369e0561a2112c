"""`python -m slurmhealth` is the `slurmhealth` command."""

from slurmhealth.hook import main

main()
