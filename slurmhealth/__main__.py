"""The `slurmhealth` entry point: one small dispatch.

`check` and the hooks (prolog, epilog, healthcheck) run before and after every job: they go to
the import-light node agent, which never imports click. Every other command goes to the click
CLI (the admin and user side).
"""

from __future__ import annotations

import sys

NODE_COMMANDS = ("check", "prolog", "epilog", "healthcheck")
HOOK_COMMANDS = NODE_COMMANDS[1:]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in NODE_COMMANDS:
        if len(argv) == 1 and argv[0] in HOOK_COMMANDS:
            # A hook as slurmd runs it (no arguments: --help never acts): start the GPU sweep
            # now, so NVML's start (docs/benchmarks.md) overlaps the imports and store reads
            # before the run.
            from slurmhealth.node.sources import start_early  # noqa: PLC0415

            start_early("gpu", costly=argv[0] == "healthcheck")
        from slurmhealth.node import agent  # noqa: PLC0415

        agent.main(argv)  # exits the process
    import signal  # noqa: PLC0415

    # systemd's stop and TimeoutStartSec send SIGTERM: end as an exit, so that every `finally`
    # runs (collect's private copy of a node store in $TMPDIR is removed, a transaction is
    # rolled back), exit status 143 as a shell reports a SIGTERM
    signal.signal(signal.SIGTERM, _terminated)
    from slurmhealth.cli import cli  # noqa: PLC0415 - click, for the admin side only

    cli.main(args=argv, prog_name="slurmhealth")


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    main()
