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
# nothing drained now, the fault stays pending: Slurm did not answer, so the fleet could not be
# counted (a failure: an alert's business)
HELD = "held"
# nothing drained now, the fault stays pending: the node reboots towards a next state and Slurm
# lifts a drain when it registers; the first run after the registration drains (planned: no alert)
REBOOTING = "rebooting"
FAILED = "failed"  # scontrol failed or timed out
WOULD_DRAIN = "would_drain"  # monitor-only mode: nothing drained, what would have been recorded
DRAIN_OUTCOMES = (DRAINED, SKIPPED, BREAKER, HELD, REBOOTING, FAILED, WOULD_DRAIN)

# Reasons: every reason slurmhealth writes starts with PREFIX (LBNL NHC's etiquette), so it
# resumes only its own drains. Probation and lemon drains are lifted by an admin, never by us.
PREFIX = "slurmhealth:"
PROBATION = "probation:"
LEMON = "lemon:"
SERVICE = "service:"  # the hardware needs service: an admin (or a passed diagnosis) lifts it
# The remediation ladder (node/ladder.py): a drain whose fault a GPU reset or a reboot may mend.
# Under way: RESET (the GPUs reset once the node is empty), REBOOT (`scontrol reboot` asked for;
# Slurm appends REBOOT_ISSUED to the reason when it reboots the node); done: AWAITING, lifted
# only by a passing diagnosis.
RESET = "reset:"
REBOOT = "reboot:"
AWAITING = "awaiting diagnosis"
REBOOT_ISSUED = " : reboot issued"  # scontrol(1), reboot: appended by slurmctld

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
# The remediation ladder (node/ladder.py): a reboot asked of Slurm (ok: taken; else refused by
# the breaker or the limit, or failed), a GPU reset waiting for the node's jobs to end, the
# remediation done (the reason now says the node awaits a diagnosis), and monitor-only's.
ACT_REBOOT = "reboot"
ACT_RESET_WAIT = "reset-wait"
ACT_REMEDIATED = "remediated"
ACT_WOULD_REBOOT = "would-reboot"
ACT_WOULD_RESET = "would-reset"
# settings.remediate: how far up the ladder slurmhealth goes by itself
REMEDIATE_OFF, REMEDIATE_RESET, REMEDIATE_REBOOT = "off", "reset", "reboot"
REMEDIATE_MODES = (REMEDIATE_OFF, REMEDIATE_RESET, REMEDIATE_REBOOT)
