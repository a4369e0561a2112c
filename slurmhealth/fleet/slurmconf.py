"""slurm.conf as Slurm reads it, and the lines slurmhealth needs merged with what a site has.

Slurm's rules (slurm.conf(5), 22.05): keys are case-insensitive; `#` starts a comment (`\\#` is a
`#`); a line ending in `\\` goes on on the next; one line may hold several `Key=Value` pairs;
when a key comes twice the later line wins (slurmctld logs "specified more than once, latest
value used"), except Prolog and Epilog from Slurm 24.05 on, whose every line names scripts to
run; `Include FILE` reads FILE in place, FILE relative to slurm.conf's directory, `%c` in it
the ClusterName in lower case. `NodeName=`, `PartitionName=`... lines are records: the other
pairs on them belong to the record, not to the cluster's settings.

`load` reads a file and its Includes; `advise` is pure: which lines to replace (each merged with
the site's own values) and the per-node commands that go with them; `render` says it as text.
Nothing here writes slurm.conf.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import textwrap
from collections.abc import Callable
from typing import NamedTuple

from slurmhealth.core.result import clean, counted, printable

DEFAULT_CONF = "/etc/slurm/slurm.conf"
HOOK = "/usr/libexec/slurmhealth/slurmhealth-hook"  # where the .deb and the .rpm put it
LINK = "50-slurmhealth"  # the hook's name in prolog.d and epilog.d
# slurmd runs the scripts a Prolog glob matches in reverse name order and stops at the first
# that fails (measured on 22.05; the prep/script plugin pushes each match onto the front of its
# list). A site's own script named 90-... runs before slurmhealth's 50-...: its setup before
# our check, its epilog's cleanup before our look for leftovers.
SITE_PREFIX = "90-site-"
TIMEOUT = 30  # PrologEpilogTimeout asked for: the hook ends within its 10 s deadline
INTERVAL = 300  # HealthCheckInterval when a site has none
# Slurm 24.05 made Prolog and Epilog lists: every line of the key names scripts to run, in file
# order, each line's glob in reverse name order, up to the first that fails (read_config.c's
# _load_script, prep_script_slurmd.c). Before, the last line replaced the others.
EVERY_LINE = (24, 5)
RECORDS = {"nodename", "partitionname", "downnodes", "frontendname", "nodeset"}
_PAIR = re.compile(r'\s*([A-Za-z0-9_.]+)\s*[-*+/]?=\s*("([^"]*)"|(\S*))')
_INCLUDE = re.compile(r"include\s+(\S.*)$", re.I)
_VERSION = re.compile(r"(?:slurm(?:-wlm)?[\s-]+)?(\d{2})\.(\d{1,2})(?:\.\d+)?(?:-\S*)?", re.I)


class Setting(NamedTuple):
    """One Key=Value pair as written, and where: FILE, line, the whole line's text."""

    key: str
    value: str
    source: str
    line: int
    text: str


class Conf(NamedTuple):
    """Every setting in file order (Includes read in place), and what could not be read."""

    settings: list
    notes: list

    def last(self, key: str) -> Setting | None:
        """The setting Slurm uses for `key` (case-insensitive): the last one written."""
        found = None
        for setting in self.settings:
            if setting.key.lower() == key.lower():
                found = setting
        return found


class Paths(NamedTuple):
    """What the nodes have: the hook, prolog.d, epilog.d, the hook's env file, and Slurm's
    version as (major, minor), None when not given."""

    hook: str
    prolog_dir: str
    epilog_dir: str
    env_file: str
    slurm: tuple | None = None


class Change(NamedTuple):
    """A line to write (`Key=Value`), why, and the site's line it replaces (None: a new one);
    `also`: what else to mind there (the old line's other settings, earlier lines of the key)."""

    key: str
    line: str
    why: str
    old: Setting | None
    also: str = ""


class Advice(NamedTuple):
    changes: list
    steps: list  # shell commands, run on every node
    notes: list


def logical_lines(text: str) -> list:
    """(first line number, text without its comment) of each line, `\\` continuations joined."""
    out: list = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        body = re.sub(r"(?<!\\)#.*", "", raw).replace("\\#", "#")
        if not pending:
            start = number
        if body.endswith("\\"):
            pending += body[:-1]
            continue
        out.append((start, pending + body))
        pending = ""
    if pending:
        out.append((start, pending))
    return out


def pairs(text: str) -> list:
    """The Key=Value pairs of one line, in order; parsing stops where the line stops being them."""
    found, at = [], 0
    while at < len(text) and text[at:].strip():
        match = _PAIR.match(text, at)
        if match is None:
            break
        value = match.group(3) if match.group(3) is not None else match.group(4)
        found.append((match.group(1), value))
        at = match.end()
    return found


def parse(text: str, source: str) -> list:
    """The settings of one file in order; an Include line is a setting keyed `Include`."""
    settings = []
    for number, line in logical_lines(text):
        found = _INCLUDE.match(line.strip())
        if found:
            settings.append(Setting("Include", found.group(1).strip(), source, number, line))
            continue
        found_pairs = pairs(line)
        if not found_pairs or found_pairs[0][0].lower() in RECORDS:
            continue
        settings += [Setting(k, v, source, number, line.strip()) for k, v in found_pairs]
    return settings


def read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def load(path: str, read: Callable[[str], str] = read_text) -> Conf:
    """The file and, in place, every file it Includes. The file itself unreadable: OSError; an
    Include unreadable: a note (its settings may override what is advised)."""
    settings: list = []
    notes: list = []
    _load_into(os.path.abspath(path), read(path), read, settings, notes, [])
    return Conf(settings, notes)


def _load_into(
    path: str, text: str, read: Callable[[str], str], settings: list, notes: list, chain: list
) -> None:
    here = os.path.dirname(chain[0] if chain else path)  # slurm.conf's, for every Include
    for setting in parse(text, path):
        if setting.key != "Include":
            settings.append(setting)
            continue
        cluster = next((s.value for s in reversed(settings) if s.key.lower() == "clustername"), "")
        cluster = cluster.lower()  # as Slurm puts it in (parse_config.c, _parse_for_format)
        target = os.path.join(here, setting.value.replace("%c", cluster))
        where = f"{setting.source}:{setting.line}"
        if target in (*chain, path):
            notes.append(f"{where}: Include {target} not read: it includes itself")
            continue
        try:
            included = read(target)
        except OSError as exc:
            notes.append(f"{where}: Include {target} not read ({exc.strerror or exc})")
            continue
        _load_into(target, included, read, settings, notes, [*chain, path])


def paths_for(
    conf_path: str, hook: str = HOOK, conf_dir: str | None = None, slurm: tuple | None = None
) -> Paths:
    """prolog.d, epilog.d and slurmhealth.env beside slurm.conf on the nodes (`conf_dir`, or
    the directory of the file read): where the hook looks for its env file."""
    folder = conf_dir or os.path.dirname(os.path.abspath(conf_path))
    return Paths(
        hook,
        os.path.join(folder, "prolog.d"),
        os.path.join(folder, "epilog.d"),
        os.path.join(folder, "slurmhealth.env"),
        slurm,
    )


def slurm_version(text: str) -> tuple | None:
    """(major, minor) of a Slurm version as written (`24.05`, `24.05.3`, `slurm 24.11.1`,
    `slurm-wlm 22.05.8`), None when it is not one."""
    found = _VERSION.fullmatch(text.strip())
    return (int(found.group(1)), int(found.group(2))) if found else None


# --- what slurmhealth needs, merged with what the site has --------------------------------------


def _items(value: str) -> list:
    return [item for item in value.split(",") if item]


def _line(key: str, value: str) -> str:
    return f'{key}="{value}"' if re.search(r"\s", value) else f"{key}={value}"


def _ours(path: str, paths: Paths) -> bool:
    """The hook itself, wherever installed, or its link in a prolog.d."""
    return path == paths.hook or os.path.basename(path) in ("slurmhealth-hook", LINK)


def _absolute(path: str, paths: Paths) -> str:
    """A path slurm.conf names, absolute: a relative one is taken from slurm.conf's directory
    (where configless Slurm looks for a relative script)."""
    return os.path.join(os.path.dirname(paths.env_file), path)


def _link(target: str, name: str) -> str:
    return f"ln -sfn {shlex.quote(target)} {shlex.quote(name)}"


def name_in(pattern: str) -> str | None:
    """A name for the hook that a glob's last part matches: 50-slurmhealth, or with the
    pattern's fixed prefix and suffix around it (`*.sh`: 50-slurmhealth.sh); None if none fits."""
    parts = re.match(r"([^*?[]*)(?:.*?)([^*?\]]*)$", pattern)
    if parts is None:  # a newline between wildcards: no name of ours, without one, fits
        return None
    prefix, suffix = parts.groups()
    for name in (LINK, prefix + LINK + suffix):
        if fnmatch.fnmatchcase(name, pattern) and not name.startswith("."):
            return name
    return None


def scripts(key: str, folder: str, conf: Conf, paths: Paths) -> tuple:
    """Prolog or Epilog: every script in a folder (a glob), slurmhealth's among them, and the
    site's own script, if it had one, kept running beside it."""
    written = [s for s in conf.settings if s.key.lower() == key.lower() and s.value]
    if len(written) > 1 and paths.slurm is not None and paths.slurm >= EVERY_LINE:
        return every_line(key, written, paths)
    notes = [several(key, written)] if len(written) > 1 and paths.slurm is None else []
    changes, steps, more = last_line(key, folder, conf, paths)
    return changes, steps, notes + more


def several(key: str, written: list) -> str:
    where = ", ".join(f"{s.source}:{s.line}" for s in written)
    return (
        f"{key} is set on {len(written)} lines ({where}). Advised as Slurm before 24.05 reads"
        " them, the last replacing the others; Slurm 24.05 and later runs every one: there,"
        " run this again with --slurm-version."
    )


def every_line(key: str, written: list, paths: Paths) -> tuple:
    """Slurm 24.05 and later, several lines: each runs, in order; the hook as one more line,
    after them all, runs after every script of the site's, as in a folder."""
    if any(_ours(_absolute(s.value, paths), paths) for s in written):
        return [], [], []
    why = (
        f"add it after your {len(written)} {key} lines (at the end of slurm.conf): Slurm 24.05"
        " and later runs every line's scripts, in order, up to the first that fails, so yours"
        " run before slurmhealth's."
    )
    return [Change(key, _line(key, paths.hook), why, None)], [], []


def last_line(key: str, folder: str, conf: Conf, paths: Paths) -> tuple:
    """The line Slurm uses (the last) made a folder's glob, its script linked in."""
    old = conf.last(key)
    value = _absolute(old.value, paths) if old and old.value else ""
    if value and _ours(value, paths):
        return [], [], []
    if any(ch in value for ch in "*?["):
        folder, pattern = os.path.split(value)
        name = name_in(pattern)
        if name is None:
            note = f"{key}={value}: link {paths.hook} into {folder} under a name it matches"
            return [], [], [note]
        return [], [_link(paths.hook, os.path.join(folder, name))], []
    steps = [f"mkdir -p {shlex.quote(folder)}"]
    why = f"every script in {folder} runs; slurmhealth's is {LINK}."
    name = os.path.basename(value)
    if value and os.path.dirname(value) == folder and not name.startswith("."):
        # Already matched by the glob: a link beside it would run it twice.
        when = "before" if name > LINK else "after"
        why += (
            f" Yours, {name}, is in it already: slurmd runs them in reverse name order, so"
            f" {when} slurmhealth's, and stops at the first that fails."
        )
    elif value:
        site = os.path.join(folder, SITE_PREFIX + name)
        steps.append(_link(value, site))
        why += (
            f" Yours keeps running, as {os.path.basename(site)}: slurmd runs them in reverse"
            " name order, so before slurmhealth's, and stops at the first that fails."
        )
    steps.append(_link(paths.hook, os.path.join(folder, LINK)))
    return [Change(key, _line(key, os.path.join(folder, "*")), why, old)], steps, []


def prolog(conf: Conf, paths: Paths) -> tuple:
    return scripts("Prolog", paths.prolog_dir, conf, paths)


def epilog(conf: Conf, paths: Paths) -> tuple:
    return scripts("Epilog", paths.epilog_dir, conf, paths)


def prolog_flags(conf: Conf, paths: Paths) -> tuple:
    old = conf.last("PrologFlags")
    flags = _items(old.value) if old else []
    # Contain and X11 imply Alloc (slurm.conf(5); `scontrol show config` shows Alloc,Contain).
    if {f.lower() for f in flags} & {"alloc", "contain", "x11"}:
        return [], [], []
    why = "Alloc runs the prolog when the job is allocated (salloc and srun jobs too)"
    why += ", not at its first step" + ("; your flags kept." if flags else ".")
    return [Change("PrologFlags", "PrologFlags=" + ",".join(["Alloc", *flags]), why, old)], [], []


def scheduler_parameters(conf: Conf, paths: Paths) -> tuple:
    old = conf.last("SchedulerParameters")
    items = _items(old.value) if old else []
    if "nohold_on_prolog_fail" in {i.lower() for i in items}:
        return [], [], []
    why = "a job whose prolog refused the node is requeued to another node, not held"
    why += "; your options kept." if items else "."
    line = "SchedulerParameters=" + ",".join([*items, "nohold_on_prolog_fail"])
    return [Change("SchedulerParameters", line, why, old)], [], []


def prolog_epilog_timeout(conf: Conf, paths: Paths) -> tuple:
    """At least TIMEOUT for the prolog and the epilog. Slurm 25.05's PrologTimeout and
    EpilogTimeout each replace PrologEpilogTimeout for their own script (read_config.c): one
    shorter is raised; PrologEpilogTimeout matters only while one of them is unset."""
    own = [conf.last(key) for key in ("PrologTimeout", "EpilogTimeout")]
    keys = [s.key for s in own if s is not None and _short(s)]
    if None in own:
        keys.insert(0, "PrologEpilogTimeout")
    changes = []
    for key in keys:
        old = conf.last(key)
        if old is not None and not _short(old):
            continue
        hung = "epilog (the node drained)" if key == "EpilogTimeout" else (
            "prolog (the node drained, the job requeued)"
        )
        why = f"slurmhealth ends within its 10 s deadline; {TIMEOUT} s is the backstop for a"
        why += f" hung {hung}"
        if old:
            why += f", where yours ({clean(old.value, 40)}) is shorter."
        else:
            why += ": Slurm's default waits forever."
        changes.append(Change(key, f"{key}={TIMEOUT}", why, old))
    return changes, [], []


def _short(setting: Setting) -> bool:
    return not (setting.value.isdigit() and int(setting.value) >= TIMEOUT)


def health_check_program(conf: Conf, paths: Paths) -> tuple:
    """HealthCheckProgram takes one program: the hook, which runs the site's own (NHC) after
    slurmhealth's once slurmhealth.env names it."""
    old = conf.last("HealthCheckProgram")
    site = _absolute(old.value, paths) if old and old.value else ""
    if site and _ours(site, paths):
        return [], [], []
    why = "slurmhealth's health check drains and resumes its own faults on every node."
    steps = []
    if site:
        why += (
            f" It runs yours ({site}) after its own: SLURMHEALTH_SITE_HEALTHCHECK in"
            f" {paths.env_file}. Each drains with its own reason prefix, resumes only its own."
        )
        setting = shlex.quote(f"SLURMHEALTH_SITE_HEALTHCHECK={site}")
        steps.append(f"echo {setting} >> {shlex.quote(paths.env_file)}")
    line = _line("HealthCheckProgram", paths.hook)
    return [Change("HealthCheckProgram", line, why, old)], steps, []


def health_check_interval(conf: Conf, paths: Paths) -> tuple:
    old = conf.last("HealthCheckInterval")
    if old and old.value.isdigit() and int(old.value) > 0:
        return [], [], []
    why = f"without an interval no health check runs: every {INTERVAL} s."
    return [Change("HealthCheckInterval", f"HealthCheckInterval={INTERVAL}", why, old)], [], []


def health_check_node_state(conf: Conf, paths: Paths) -> tuple:
    old = conf.last("HealthCheckNodeState")
    wanted = node_states(old.value if old else None, fresh=conf.last("HealthCheckProgram") is None)
    if wanted is None:
        return [], [], []
    why = "ANY: busy nodes too, so a GPU that breaks under a long job is caught before the next"
    why += " job" + (" (CYCLE spreads the runs over the interval)." if "CYCLE" in wanted else ".")
    return [Change("HealthCheckNodeState", f"HealthCheckNodeState={wanted}", why, old)], [], []


def node_states(value: str | None, fresh: bool) -> str | None:
    """HealthCheckNodeState to write, or None when the site's will do (Slurm's default is ANY).
    A site with no health check yet gets ANY,CYCLE; one without ANY gets ANY, its CYCLE kept."""
    if value is None:
        return "ANY,CYCLE" if fresh else None
    items = {i.upper() for i in _items(value)}
    if "ANY" in items:
        return None
    return "ANY,CYCLE" if "CYCLE" in items else "ANY"


# Each rule: (conf, paths) -> (changes, steps, notes), in the order they are printed.
RULES = (
    prolog,
    epilog,
    prolog_flags,
    scheduler_parameters,
    prolog_epilog_timeout,
    health_check_program,
    health_check_interval,
    health_check_node_state,
)


def advise(conf: Conf, paths: Paths) -> Advice:
    advice = Advice([], [], list(conf.notes))
    for rule in RULES:
        changes, steps, notes = rule(conf, paths)
        advice.changes.extend(changes)
        advice.steps.extend(s for s in steps if s not in advice.steps)
        advice.notes.extend(notes)
    advice.changes[:] = [located(c, conf, advice.changes) for c in advice.changes]
    return advice


def located(change: Change, conf: Conf, changes: list) -> Change:
    """The change with what else to mind where its key is set: other settings on the line it
    replaces (keep them) and earlier lines of the key (overridden; Slurm logs each duplicate)."""
    if change.old is None:
        return change
    changed = {c.key.lower() for c in changes}
    here = (change.old.source, change.old.line)
    kept = [
        f"{s.key}={s.value}"
        for s in conf.settings
        if (s.source, s.line) == here and s.key.lower() not in changed
    ]
    earlier = [
        f"{s.source}:{s.line}"
        for s in conf.settings
        if s.key.lower() == change.key.lower() and (s.source, s.line) != here
    ]
    also = []
    if kept:
        also.append("keep the line's other settings: " + " ".join(kept))
    if earlier:
        also.append("remove the earlier, overridden " + change.key + " at " + ", ".join(earlier))
    return change._replace(also="; ".join(also))


# --- as text --------------------------------------------------------------------------------------

WIDTH = 96


def _comment(text: str) -> list:
    """Wrapped as comment lines; paths are never broken at their hyphens."""
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent="# ",
        subsequent_indent="#   ",
        break_long_words=False,
        break_on_hyphens=False,
    )


def render(advice: Advice, conf_path: str) -> str:
    """The advice as slurm.conf text: each new line under its why and the site's old line
    (comments), then the commands for every node. Strings from the site's files are made
    printable (its bytes are not trusted to reach a terminal as they are)."""
    where = clean(conf_path, 300)
    out: list = []
    if advice.changes:
        out += _comment(
            f"slurmhealth: {counted(len(advice.changes), 'line')} of {where} to change, each merged"
            " with what it sets now. Replace the line shown as `was` with the line under it (a new"
            " one: add it); lines not shown are fine as they are."
        )
    else:
        out.append(f"# slurmhealth: nothing to change in {where}.")
    for change in advice.changes:
        out.append("")
        out += _comment(f"{change.key}: {change.why}")
        if change.old is not None:
            old = change.old
            out.append(f"# was {clean(old.source, 200)}:{old.line}: {clean(old.text, 300)}")
            if change.also:
                out += _comment(f"({clean(change.also, 600)})")
        out.append(change.line)
    for note in advice.notes:
        out += ["", *_comment(f"note: {note}")]
    if advice.steps:
        out += ["", "# On every node, as root, then `scontrol reconfigure`:"]
        out += [f"#   {step}" for step in advice.steps]
    shown = [printable(line) for line in out]
    if shown != out:
        shown.insert(0, "# note: values below hold characters that are not printable (shown as ?)")
    return "\n".join(shown) + "\n"
