"""`slurmhealth config from-nhc`: an LBNL NHC configuration read as slurmhealth expectations.

Pure: the text of an nhc.conf goes in; the expectations per node pattern and one note per line
come out (docs/nhc.md has the table of what maps to what). NHC's file is a list of
`TARGET || CHECK ARGS` lines (NHC's README, "Configuration"): TARGET is a match string (a glob,
a `/regexp/`, a `{node range}`, any of them negated with `!`); CHECK is a shell word list, split
here with shlex, never run. Every line is accounted for: translated, translated in part (what
was left out is said), or not translated, with why.

NHC's checks add up: a node runs every line whose target matches it. slurmhealth's `[[node]]`
blocks override: the last block that matches a node sets a key. So a block's lists begin with
the lists every node gets (`*`), and where two blocks of other patterns set the same key the
translation says so: a node in both gets the later block's.
"""

from __future__ import annotations

import json
import re
import shlex

from slurmhealth.core import hostlist
from slurmhealth.core.result import clean
from slurmhealth.node.checks.fs import FILE_TESTS  # test(1)'s letters that fs.files judges

TYPE_CHECKING = False
if TYPE_CHECKING:
    from slurmhealth.core.command import Console

TYPE_CHECKING = False  # typing stays unimported at run time, as elsewhere in node/
if TYPE_CHECKING:
    from typing import Callable

    Values = dict[str, dict[str, object]]  # area -> key -> value
    Done = tuple[str, str]  # (how: "ok", "partial" or "no", what it became or why not)

ALL = "*"
_KIB = 1024
_UNITS = {"": 1, "k": 1, "m": _KIB, "g": _KIB**2, "t": _KIB**3, "p": _KIB**4}


class Translation:
    """What an nhc.conf says, as slurmhealth's: blocks {pattern: {area: {key: value}}} in the
    order their patterns first appear (ALL first), and per line (number, text, how, what)."""

    def __init__(self) -> None:
        self.blocks: dict[str, Values] = {ALL: {}}
        self.lines: list[tuple[int, str, str, str]] = []

    def put(self, pattern: str, area: str, key: str, value: object) -> None:
        values = self.blocks.setdefault(pattern, {}).setdefault(area, {})
        if isinstance(value, list):
            got = values.setdefault(key, [])
            assert isinstance(got, list)
            got.extend(v for v in value if v not in got)
        elif isinstance(value, dict):
            mapping = values.setdefault(key, {})
            assert isinstance(mapping, dict)
            mapping.update(value)
        else:
            values[key] = value

    def untranslated(self) -> list[tuple[int, str, str]]:
        """(line number, line, why) of every line not translated or translated in part."""
        return [(n, text, what) for n, text, how, what in self.lines if how != "ok"]


def translate(text: str) -> Translation:
    """An nhc.conf's text -> its Translation. Never raises on what the file holds."""
    out = Translation()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        how, what = _line(line, out)
        out.lines.append((number, line, how, what))
    return out


def render(out: Translation, source: str) -> str:
    """The Translation as a slurmhealth.toml: every node's expectations in their areas' tables,
    each other pattern a `[[node]]` block whose lists begin with every node's; at the top, as
    comments, the lines not translated or translated in part, and why."""
    lines = [
        f"# Written by `slurmhealth config from-nhc` from {clean(source, 200)}.",
        "# Review it, check it with `slurmhealth config validate`, then install it.",
    ]
    left = out.untranslated()
    if left:
        lines.append(f"# {len(left)} of {len(out.lines)} lines not translated, or in part:")
        lines += [f"#   line {n}: {clean(text, 160)}: {clean(why, 200)}" for n, text, why in left]
    lines.append("")
    for area, values in out.blocks[ALL].items():
        lines.append(f"[{area}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in values.items()]
        lines.append("")
    for pattern, areas in out.blocks.items():
        if pattern == ALL:
            continue
        lines += ["[[node]]", f"match = {toml_value(pattern)}"]
        for area, values in areas.items():
            for key, value in values.items():
                lines.append(f"{area}.{key} = {toml_value(_with_all(out, area, key, value))}")
        lines.append("")
    return "\n".join(lines)


def overlaps(out: Translation) -> list[str]:
    """The keys two blocks of patterns other than `*` both set: a node matching both gets the
    later block's (NHC would have run both lines)."""
    seen: dict[str, str] = {}
    said = []
    for pattern, areas in out.blocks.items():
        for area, values in areas.items():
            for key in values:
                name = f"{area}.{key}"
                if pattern != ALL and name in seen:
                    said.append(
                        f"{name} is set for {seen[name]} and for {pattern}: a node in both"
                        " gets the later one's"
                    )
                if pattern != ALL:
                    seen.setdefault(name, pattern)
    return said


def _with_all(out: Translation, area: str, key: str, value: object) -> object:
    """A block's value with every node's before it, where both are lists or maps."""
    common = out.blocks[ALL].get(area, {}).get(key)
    if isinstance(common, list) and isinstance(value, list):
        return common + [v for v in value if v not in common]
    if isinstance(common, dict) and isinstance(value, dict):
        return {**common, **value}
    return value


def toml_value(value: object) -> str:
    """A value as TOML: map keys quoted unless bare (a mount point is no bare key)."""
    if isinstance(value, dict):
        items = (f"{_key(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{ " + ", ".join(items) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _line(line: str, out: Translation) -> Done:
    if "||" not in line:
        return "no", "not a `TARGET || CHECK` line"
    target, _, command = (part.strip() for part in line.partition("||"))
    pattern, why = _pattern(target)
    if pattern is None:
        return "no", why
    try:
        words = shlex.split(command, comments=True)
    except ValueError as exc:
        return "no", f"cannot split the line as the shell would: {exc}"
    if any(ch < " " or ch == "\x7f" for word in words for ch in word):
        return "no", "control characters in the line"
    if not words:
        return "no", "no check named"
    if words[0] == "export" or "=" in words[0]:
        return "no", "an NHC setting: slurmhealth's own settings are in [settings]"
    check = CHECKS.get(words[0])
    if check is None:
        return "no", UNTRANSLATED.get(words[0], f"{words[0]} has no slurmhealth equivalent")
    try:
        return check(pattern, words[1:], out)
    except (ValueError, IndexError) as exc:
        return "no", f"cannot read {words[0]}'s arguments: {exc}"


def _pattern(target: str) -> tuple[str | None, str]:
    """NHC's target -> a slurmhealth node pattern (core/hostlist), or None and why not."""
    negate = target.startswith("!")
    body = target[1:] if negate else target
    if body.startswith("/"):
        return None, "a regular-expression target: write it as a node pattern by hand"
    if body.startswith("@") or body.startswith("%"):
        return None, "a node-group target: write it as a node pattern by hand"
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    if body in ("*", "") and not negate:
        return ALL, ""
    terms = [t.strip() for t in body.split(",") if t.strip()]
    if negate and len(terms) > 1:
        return None, "a negated list of ranges: write it as a node pattern by hand"
    pattern = ",".join(("!" if negate else "") + t for t in terms)
    try:
        hostlist.validate(pattern)
    except hostlist.PatternError as exc:
        return None, f"target {clean(target, 80)} is no node pattern: {exc}"
    return pattern, ""


def _options(args: list[str], flags: str, valued: str) -> tuple[dict[str, object], list[str]]:
    """getopts-style: ({flag: True or its value (repeated -f: a list)}, the other words)."""
    found: dict[str, object] = {}
    rest: list[str] = []
    words = iter(args)
    for word in words:
        if len(word) < 2 or not word.startswith("-") or word == "--":
            rest.append(word)
            continue
        letters = word[1:]
        while letters:
            letter, letters = letters[0], letters[1:]
            if letter in valued:
                value = letters or next(words)
                letters = ""
                if letter in ("f", "F"):
                    got = found.setdefault("f", [])
                    assert isinstance(got, list)
                    got.append(value)
                else:
                    found[letter] = value
            elif letter in flags:
                found[letter] = True
            else:
                raise ValueError(f"unknown option -{letter}")
    return found, rest


def size_mib(text: str) -> float:
    """NHC's size -> MiB: a number with an optional unit, kB when none (NHC's README: `k` or
    `kB` the default, `M`/`MB`, `G`/`GB`, `T`/`TB`, any case)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgtp]?)i?b?", text.strip().lower())
    if not match:
        raise ValueError(f"not a size: {text!r}")
    kib = float(match.group(1)) * _UNITS[match.group(2)]
    return kib / _KIB


def _gb(text: str) -> float:
    return round(size_mib(text) / _KIB, 2)


def _is_plain(text: str) -> bool:
    """A plain word, not an NHC match string (glob, /regexp/, negation)."""
    return bool(text) and not any(ch in text for ch in "*?[]/!{}")


# --- filesystems ----------------------------------------------------------------------------


def _fs_mount(mode: str) -> Callable[[str, list[str], Translation], Done]:
    def check(pattern: str, args: list[str], out: Translation) -> Done:
        found, rest = _options(args, "0r", "tsoOeEfF")
        given = found.get("f")
        mounts = [str(m) for m in given] if isinstance(given, list) else []
        if not mounts and rest:  # the deprecated form: mountpoint [source] [fstype] [options]
            mounts = [rest[0]]
            for letter, value in zip("sto", rest[1:4]):
                found.setdefault(letter, value)
        if not mounts:
            raise ValueError("no mount point")
        out.put(pattern, "fs", "mounts", mounts)
        if mode:
            out.put(pattern, "fs", mode, mounts)
        left = []
        fstype = found.get("t")
        if isinstance(fstype, str) and _is_plain(fstype):
            out.put(pattern, "fs", "fstype", {m: fstype for m in mounts})
        elif fstype:
            left.append("a file system type that is a match string")
        if found.get("s"):
            left.append("the source (-s) is not compared")
        if found.get("o"):
            left.append("the mount options (-o) are not compared")
        if any(found.get(k) for k in "rOeE"):
            left.append("no remount or action is run: a missing mount fails the check")
        if found.get("0"):
            left.append("-0 (non-fatal): set checks.\"fs.mounts\" severity by hand")
        if found.get("F"):
            left.append("an automount is not triggered first")
        what = f"fs.mounts{f' and fs.{mode}' if mode else ''}: {', '.join(mounts)}"
        return ("partial", f"{what}; " + "; ".join(left)) if left else ("ok", what)

    return check


def _fs_free(pattern: str, args: list[str], out: Translation) -> Done:
    mount, floor = args[0], args[1]
    if floor.endswith("%"):
        out.put(pattern, "fs", "free_pct_at", {mount: float(floor[:-1])})
        return "ok", f"fs.free_pct_at: {mount} {floor[:-1]}%"
    out.put(pattern, "fs", "free_mb_at", {mount: round(size_mib(floor), 1)})
    return "ok", f"fs.free_mb_at: {mount} {round(size_mib(floor), 1)} MiB"


def _fs_used(pattern: str, args: list[str], out: Translation) -> Done:
    mount, most = args[0], args[1]
    if not most.endswith("%"):
        return "no", "a used-space ceiling in bytes: say it as a free-space floor (fs.free_mb_at)"
    free = round(100.0 - float(most[:-1]), 3)
    out.put(pattern, "fs", "free_pct_at", {mount: free})
    return "ok", f"fs.free_pct_at: {mount} {free}% (used at most {most})"


# --- memory and CPUs ------------------------------------------------------------------------


def _hw_cpuinfo(pattern: str, args: list[str], out: Translation) -> Done:
    sockets, cores, threads = (list(args) + ["", "", ""])[:3]
    said = []
    if sockets:
        out.put(pattern, "hw", "sockets", int(sockets))
        said.append(f"hw.sockets {sockets}")
    if threads:
        out.put(pattern, "hw", "cpus", int(threads))
        said.append(f"hw.cpus {threads}")
    if cores and threads and int(threads) % int(cores) == 0:
        out.put(pattern, "hw", "threads_per_core", int(threads) // int(cores))
        said.append(f"hw.threads_per_core {int(threads) // int(cores)}")
    if not said:
        raise ValueError("no counts")
    return "ok", ", ".join(said)


def _hw_physmem(pattern: str, args: list[str], out: Translation) -> Done:
    low, high = _gb(args[0]), _gb(args[1]) if len(args) > 1 and args[1] else None
    out.put(pattern, "hw", "memory_gb", low)
    said = f"hw.memory_gb {low}"
    left = []
    if len(args) > 2:
        fudge = args[2]
        if fudge.endswith("%"):
            out.put(pattern, "hw", "memory_tolerance_pct", float(fudge[:-1]))
            said += f", hw.memory_tolerance_pct {fudge[:-1]}"
        else:
            left.append("an absolute tolerance: say it in percent")
    if high is not None and high != low:
        left.append(f"the ceiling {high} GiB is not judged (memory at least {low} GiB)")
    return ("partial", f"{said}; " + "; ".join(left)) if left else ("ok", said)


def _hw_swap(pattern: str, args: list[str], out: Translation) -> Done:
    low, high = _gb(args[0]), _gb(args[1])
    if low != high:
        return "no", "a range of swap sizes: hw.swap_gb expects one size"
    out.put(pattern, "hw", "swap_gb", low)
    return "ok", f"hw.swap_gb {low}"


def _hw_floor(key: str, approximate: str = "") -> Callable[[str, list[str], Translation], Done]:
    def check(pattern: str, args: list[str], out: Translation) -> Done:
        out.put(pattern, "hw", key, _gb(args[0]))
        what = f"hw.{key} {_gb(args[0])}"
        return ("partial", f"{what}; {approximate}") if approximate else ("ok", what)

    return check


# --- networks, processes, kernel log ----------------------------------------------------------


def _hw_eth(pattern: str, args: list[str], out: Translation) -> Done:
    out.put(pattern, "net", "up", [args[0]])
    return "partial", f"net.up: {args[0]}; up with carrier, where NHC asks only that it exists"


def _hw_ib(pattern: str, args: list[str], out: Translation) -> Done:
    out.put(pattern, "ib", "rate", int(float(args[0])))
    said = f"ib.rate {int(float(args[0]))}"
    if len(args) > 1:
        out.put(pattern, "ib", "devices", [args[1]])
        said += f", ib.devices: {args[1]}"
    return "ok", said


def _ps_service(pattern: str, args: list[str], out: Translation) -> Done:
    found, rest = _options(args, "0fSrcsk", "udmeE")
    if not rest:
        raise ValueError("no service named")
    name = str(found.get("d") or rest[-1])
    if found.get("m"):
        return "no", "a process match string (-m): name the process in ps.daemons by hand"
    forbidden = bool(found.get("s") or found.get("k"))
    key = "absent" if forbidden else "daemons"
    out.put(pattern, "ps", key, [name])
    left = []
    if found.get("u"):
        left.append("the owner (-u) is not compared")
    if any(found.get(k) for k in "SrceE") or forbidden:
        left.append("no service is started, stopped or killed: the check fails and says")
    if found.get("f"):
        left.append("the whole command line (-f) is not compared, the process name is")
    if found.get("0"):
        left.append('-0 (non-fatal): set checks."ps.daemons" severity by hand')
    what = f"ps.{key}: {name}"
    return ("partial", f"{what}; " + "; ".join(left)) if left else ("ok", what)


def _ps_listed(key: str) -> Callable[[str, list[str], Translation], Done]:
    def check(pattern: str, args: list[str], out: Translation) -> Done:
        out.put(pattern, "ps", key, [args[0]])
        if len(args) > 1:
            return "partial", f"ps.{key}: {args[0]}; the owner and arguments are not compared"
        return "ok", f"ps.{key}: {args[0]}"

    return check


def _hw_mcelog(pattern: str, args: list[str], out: Translation) -> Done:
    return "ok", "the mce and edac areas (kernel log and EDAC counts), on by default"


def _file_test(pattern: str, args: list[str], out: Translation) -> Done:
    found, paths = _options(args, "abcdefghkprstuwxOGLSN", "")
    if not paths:
        raise ValueError("no file named")
    tests = "".join(sorted({"a": "e", "h": "L"}.get(k, k) for k in found))
    unknown = set(tests) - set(FILE_TESTS)
    if unknown:
        return "no", f"file test(s) -{' -'.join(sorted(unknown))} are not judged"
    out.put(pattern, "fs", "files", {path: tests or "e" for path in paths})
    return "ok", f"fs.files: {', '.join(paths)} ({tests or 'e'})"


CHECKS: dict[str, Callable[[str, list[str], Translation], Done]] = {
    "check_fs_mount": _fs_mount(""),
    "check_fs_mount_rw": _fs_mount("rw"),
    "check_fs_mount_ro": _fs_mount("ro"),
    "check_fs_free": _fs_free,
    "check_fs_used": _fs_used,
    "check_hw_cpuinfo": _hw_cpuinfo,
    "check_hw_physmem": _hw_physmem,
    "check_hw_swap": _hw_swap,
    "check_hw_physmem_free": _hw_floor("free_memory_gb"),
    "check_hw_mem_free": _hw_floor(
        "free_memory_gb", "free memory without swap, where NHC adds the free swap"
    ),
    "check_hw_swap_free": _hw_floor("swap_free_gb"),
    "check_hw_eth": _hw_eth,
    "check_hw_ib": _hw_ib,
    "check_ps_service": _ps_service,
    "check_ps_daemon": _ps_listed("daemons"),
    "check_ps_blacklist": _ps_listed("absent"),
    "check_hw_mcelog": _hw_mcelog,
    "check_file_test": _file_test,
}

# Why the other checks of NHC's README are not translated.
UNTRANSLATED = {
    "check_cmd_output": "runs a command: slurmhealth runs no site commands in its checks",
    "check_cmd_status": "runs a command: slurmhealth runs no site commands in its checks",
    "check_dmi_data_match": "DMI data is not read",
    "check_dmi_raw_data_match": "DMI data is not read",
    "check_file_contents": "file contents are not matched",
    "check_file_stat": "owners and device numbers are not compared (check_file_test's tests are)",
    "check_fs_inodes": "a total inode count: say a free-inode floor (fs.inodes_free_pct)",
    "check_fs_ifree": "a free-inode count: say it in percent (fs.inodes_free_pct)",
    "check_fs_iused": "a used-inode count: say a free-inode floor in percent (fs.inodes_free_pct)",
    "check_fs_size": "a file system's total size is not judged",
    "check_hw_mem": "RAM and swap together: say them apart (hw.memory_gb, hw.swap_gb)",
    "check_hw_gm": "Myrinet is not read",
    "check_nv_healthmon": "the gpu and nvlink areas judge the GPUs through NVML",
    "check_net_ping": "no network probes in the hooks (slurmhealth diagnose runs ib tests)",
    "check_net_socket": "sockets are not listed",
    "check_ps_cpu": "processes' resource use is not judged",
    "check_ps_mem": "processes' resource use is not judged",
    "check_ps_physmem": "processes' resource use is not judged",
    "check_ps_time": "processes' resource use is not judged",
    "check_ps_kswapd": "processes' resource use is not judged",
    "check_ps_loadavg": "the load average is not judged",
    "check_ps_unauth_users": "users' processes are Slurm's to account (pam_slurm_adopt)",
    "check_ps_userproc_lineage": "users' processes are Slurm's to account (pam_slurm_adopt)",
    "check_moab_sched": "Moab is not read",
    "check_moab_rm": "Moab is not read",
    "check_moab_torque": "Moab is not read",
}


def from_file(path: str, output: str, console: Console) -> bool:
    """`slurmhealth config from-nhc`: translate the nhc.conf at `path`, say on standard error
    each line not translated in full and each check slurmhealth already runs, and write the
    config to standard output ("-") or `output` (0644). Whether a line was not translated in
    full; CommandError with one line when the file cannot be read (exit 2) or written, or the
    translation does not validate."""
    from slurmhealth.core.command import CommandError, emit  # noqa: PLC0415
    from slurmhealth.node import config  # noqa: PLC0415

    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(4 << 20)
    except OSError as exc:
        raise CommandError(f"{clean(path, 300)}: {exc.strerror or exc}", status=2) from None
    done = translate(text)
    out = render(done, path)
    try:
        config.parse(out, "<from-nhc>")  # what we write must validate
    except config.ConfigError as exc:
        raise CommandError(f"the translation does not validate: {exc}") from None
    for number, line, why in done.untranslated():
        console.err(f"{clean(path, 200)}:{number}: {clean(line, 160)}: {clean(why, 200)}")
    for said in overlaps(done):
        console.err(f"{clean(path, 200)}: {clean(said, 300)}")
    emit(out, output, console, 0o644)
    return bool(done.untranslated())
