"""Do what `slurmhealth config slurm-conf` prints, as an admin would: each new line replaces the
line its `# was FILE:LINE:` comment names (a line without one is added at the end of the file
read), then the commands listed for every node run in /bin/sh. Used by the tests of the command
(tests/fleet/test_slurmconf.py) and on the real Slurm (test_slurm_conf.py)."""

from __future__ import annotations

import re
import subprocess

_WAS = re.compile(r"^# was (.+):(\d+): ")
STEPS_HEADER = "# On every node"


def blocks(output: str) -> list:
    """(new line, (file, line number) or None) of each change the output prints."""
    found = []
    for block in output.split("\n\n"):
        lines = block.splitlines()
        new = [line for line in lines if line and not line.startswith("#")]
        if not new:
            continue
        (line,) = new
        was = [_WAS.match(x) for x in lines if _WAS.match(x)]
        found.append((line, (was[0].group(1), int(was[0].group(2))) if was else None))
    return found


def steps(output: str) -> list:
    """The commands printed for every node, in order."""
    if STEPS_HEADER not in output:
        return []
    tail = output.split(STEPS_HEADER, 1)[1].splitlines()[1:]
    return [line[len("#   ") :] for line in tail if line.startswith("#   ")]


def apply(output: str, conf_path: str) -> None:
    """Edit the files the output names and run its node commands (they must all succeed)."""
    replaced: dict = {}
    added = []
    for line, where in blocks(output):
        if where is None:
            added.append(line)
        else:
            replaced.setdefault(where[0], {}).setdefault(where[1], []).append(line)
    for path, by_line in replaced.items():
        with open(path, encoding="utf-8") as handle:
            old = handle.read().splitlines()
        new = []
        for number, text in enumerate(old, 1):
            new += by_line.get(number, [text])
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("\n".join(new) + "\n")
    if added:
        with open(conf_path, "a", encoding="utf-8") as handle:
            handle.write("\n".join(added) + "\n")
    for command in steps(output):
        subprocess.run(["/bin/sh", "-c", command], check=True, timeout=30)
