"""Names shared by every layer: phases, drain outcomes, our reason prefixes, Slurm job states.

One home, so a comparison is against a name that a grep finds everywhere it is used.
"""

from __future__ import annotations

DAY = 86400.0

# Phases of a run: Slurm's hooks, an admin's `slurmhealth check`, and `slurmhealth diagnose`.
PROLOG, EPILOG, HEALTHCHECK, CHECK = "prolog", "epilog", "healthcheck", "check"
DIAG = "diag"
HOOKS = (PROLOG, EPILOG, HEALTHCHECK)
PHASES = (*HOOKS, CHECK, DIAG)

# What one automatic drain attempt came to (node/actions.drain).
DRAINED = "drained"  # the node is drained, with our reason
SKIPPED = "skipped"  # someone else took the node out already: left alone
BREAKER = "breaker"  # the circuit breaker is open: nothing drained, loudly
# nothing drained now, the fault stays pending: the fleet could not be counted, or the node
# reboots towards a next state (Slurm lifts a drain when it registers)
HELD = "held"
FAILED = "failed"  # scontrol failed or timed out
WOULD_DRAIN = "would_drain"  # monitor-only mode: nothing drained, what would have been recorded
DRAIN_OUTCOMES = (DRAINED, SKIPPED, BREAKER, HELD, FAILED, WOULD_DRAIN)

# Reasons: every reason slurmhealth writes starts with PREFIX (LBNL NHC's etiquette), so it
# resumes only its own drains. Probation and lemon drains are lifted by an admin, never by us.
PREFIX = "slurmhealth:"
PROBATION = "probation:"
LEMON = "lemon:"
SERVICE = "service:"  # the hardware needs service: an admin (or a passed diagnosis) lifts it

# sacct states of a job that has not ended (sacct(1), JOB STATE CODES).
RUNNING_STATES = (
    "PENDING",
    "RUNNING",
    "REQUEUED",
    "SUSPENDED",
    "CONFIGURING",
    "COMPLETING",
    "RESIZING",
)
# sacct states of a job that ended without success.
FAILED_STATES = ("FAILED", "TIMEOUT", "OUT_OF_MEMORY", "CANCELLED", "DEADLINE", "PREEMPTED")

# What the actions table records (core/store.py): the drain outcomes above as they are written.
ACT_DRAIN = "drain"
ACT_RESUME = "resume"
ACT_BREAKER = BREAKER  # a drain the circuit breaker refused
ACT_DRAIN_SKIPPED = "drain-skipped"
ACT_RESET_GPU = "reset_gpu"
ACT_WOULD_DRAIN = "would-drain"  # monitor-only: the drain enforcing would have made
