"""The `slurmhealth` entry point: one small dispatch.

`check` and the hooks (prolog, epilog, healthcheck) run before and after every job: they go to
the import-light node agent, which never imports click. Every other command goes to the click
CLI (the admin and user side).
"""

from __future__ import annotations

import sys

NODE_COMMANDS = ("check", "prolog", "epilog", "healthcheck")


def main(argv: list | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in NODE_COMMANDS:
        from slurmhealth.node import agent  # noqa: PLC0415

        agent.main(argv)  # exits the process
    from slurmhealth.cli import cli  # noqa: PLC0415 - click, for the admin side only

    cli.main(args=argv, prog_name="slurmhealth")


if __name__ == "__main__":
    main()
