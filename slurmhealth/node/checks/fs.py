"""Filesystem checks from mountinfo and statvfs (the `fs` section of a snapshot, sources/fs.py).

What NHC's check_fs_mount, check_fs_mount_rw/_ro, check_fs_free, check_fs_ifree and
check_file_test judge, with the names a `config from-nhc` translation targets ([fs] mounts, rw,
ro, fstype, free_pct_at, free_mb_at, inodes_free_pct, files).

Which mounts are judged: every mount listed in `mounts`, `rw`, `ro` or `fstype`, plus the mounts
holding the `free_on` paths ("/", "/tmp", "/var" by default: where /tmp is on /, / is judged
once) and the paths `free_pct_at` and `free_mb_at` name. A job writes its temporary files, its
core dumps and its logs there: a full /tmp or /var kills jobs on the node, so a filesystem below
its floor fails (drain), as NHC does.

Floors, on judged mounts that can be written (a read-only mount, a squashfs image, is full by
design):
- free_pct 3.0: free space as df counts it, f_bavail / (f_blocks - f_bfree + f_bavail): the
  space a job (not root) may still use, so ext4's reserved blocks do not count as free. 3% is
  NHC's sample config's floor for / and /tmp (nhc.conf, check_fs_free / 3%).
- inodes_free_pct 3.0: free inodes, f_ffree / f_files; a filesystem that reports no inode limit
  (f_files 0: btrfs, some tmpfs) is not judged. A job that writes many small files runs out
  of inodes with space left.
- free_mb: an absolute floor in MiB, off by default; both floors apply where both are set.
- free_pct_at, free_mb_at: a floor of a mount point's own (NHC's `check_fs_free /scratch 10%`),
  in place of free_pct or free_mb on the mount holding that path. Where two named paths are on
  one mount (/tmp and /var on /), the higher floor holds.

Read-only: a mount listed in `rw` that is read-only fails (drain); one listed in `ro` that is
writable warns. With no list, a judged mount whose mount options say rw but whose superblock
says ro (mountinfo's super options) fails with reboot: the kernel remounted it after an error
(ext4's errors=remount-ro, XFS's shutdown), and a reboot runs the fsck it needs. A mount that
was mounted ro on purpose says ro in both places and is left alone.

A hung mount (statvfs not back within `stat_timeout`, a dead NFS or Lustre server) fails
(drain): jobs that touch it hang in the kernel. ESTALE, EIO and ENOTCONN (a stale NFS handle, a
failed disk, a FUSE daemon that died) fail the same way; other errors warn.

Files (`files`, NHC's check_file_test): each listed path must pass the test(1) tests its letters
name, as root runs them (the hooks' user): b block device, c character device, d directory, e
exists, f regular file, L symbolic link, p named pipe, S socket, s not empty, r readable, w
writable, x executable. A path missing, hung (its stat not back within `stat_timeout`) or
failing a test fails (drain): a job that needs /etc/slurm or a scratch directory fails without
it. Kind and size tests follow a symbolic link (stat(2)); L alone reads the link (lstat(2)).
"""

from __future__ import annotations

import stat as modes

from slurmhealth.core.result import DRAIN, REBOOT, Result, clean, counted, fail, ok, skip, warn
from slurmhealth.node.checks.base import Context, summarize
from slurmhealth.node.sources.fs import PSEUDO, holder, unescape

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

    from slurmhealth.node.checks.base import Facts, Schema

    Mount = dict[str, Any]  # one mountinfo line, parse_line's keys

AREA = "fs"
SOURCE = "fs"

DEFAULTS: Schema = {
    "mounts": (None, list, "mount points that must be mounted (NHC check_fs_mount)"),
    "rw": (None, list, "mount points that must be read-write (NHC check_fs_mount_rw)"),
    "ro": (None, list, "mount points that must be read-only (NHC check_fs_mount_ro)"),
    "fstype": (None, dict, 'filesystem type per mount point: { "/scratch" = "lustre" }'),
    "free_on": (
        ["/", "/tmp", "/var"],  # noqa: S108 - paths judged, nothing is written there
        list,
        "paths whose filesystems the free floors judge, with every listed mount: jobs write "
        "there, a full one kills them",
    ),
    "free_pct": (3.0, float, "free space floor, % as df counts it (NHC's sample: 3%)"),
    "free_mb": (None, float, "free space floor in MiB; unset: only free_pct"),
    "free_pct_at": (
        None,
        dict,
        'free space floor per mount point, %, in place of free_pct there: { "/scratch" = 10.0 } '
        "(NHC check_fs_free MP 10%); the mount holding each path is judged",
    ),
    "free_mb_at": (
        None,
        dict,
        'free space floor per mount point, MiB, in place of free_mb there: { "/tmp" = 128.0 } '
        "(NHC check_fs_free MP 128MB); the mount holding each path is judged",
    ),
    "inodes_free_pct": (3.0, float, "free inode floor, %; a job of small files runs out first"),
    "stat_timeout": (
        0.5,
        float,
        "seconds a mount's statvfs may take before the mount is called hung (a dead NFS or "
        "Lustre server); keep it under settings.timeout_fs",
    ),
    "files": (
        None,
        dict,
        'paths and the test(1) letters each must pass, as root: { "/etc/slurm" = "dr" } '
        "(NHC check_file_test; b c d e f L p S s r w x)",
    ),
}

# The test(1) letters fs.files judges: the file kinds by their stat(2) type bits, then the rest.
KINDS = {
    "b": modes.S_IFBLK,
    "c": modes.S_IFCHR,
    "d": modes.S_IFDIR,
    "f": modes.S_IFREG,
    "p": modes.S_IFIFO,
    "S": modes.S_IFSOCK,
}
FILE_TESTS = "bcdefLprSswx"
_TEST_NAMES = {
    "b": "a block device", "c": "a character device", "d": "a directory", "e": "there",
    "f": "a regular file", "L": "a symbolic link", "p": "a named pipe", "S": "a socket",
    "s": "non-empty", "r": "readable", "w": "writable", "x": "executable",
}

_NAME_MAX = 80  # a mount point as a message names it
_POINT_MAX = 4096  # PATH_MAX: longer is not a path
# Errors of statvfs that mean the mount is broken, not merely out of reach (stat(2), nfs(5)).
_BROKEN = ("ESTALE", "EIO", "ENOTCONN")
# What genconf leaves out of a node's lasting mounts (NHC's genconf lists every mount): memory
# filesystems and a container's layers come and go with the boot and the runtime; the trees of
# the kernel, the runtimes and snaps (squashfs under /snap) likewise.
_NO_GENCONF = ("tmpfs", "devtmpfs", "overlay", "ramfs")
_NOT_MOUNTS = ("/proc", "/sys", "/dev", "/run", "/snap", "/var/lib/docker", "/var/lib/kubelet")


# ---------------------------------------------------------------- parse (pure, never raises)


def _options(field: str) -> list[str]:
    return [o for o in field.split(",") if o][:64]


def parse_line(line: object) -> Mount | None:
    """One mountinfo line (proc(5)) -> {"point", "root", "options", "fstype", "source",
    "super"}; None for a line that is not one. The mount point and source are unescaped."""
    if not isinstance(line, str):
        return None
    fields = line.split(" ")
    if len(fields) < 10 or "-" not in fields[6:]:
        return None
    dash = fields.index("-", 6)
    if len(fields) < dash + 3:
        return None
    point = unescape(fields[4])
    if not point.startswith("/") or len(point) > _POINT_MAX:
        return None
    return {
        "point": point,
        "root": unescape(fields[3])[:_POINT_MAX],
        "options": _options(fields[5]),
        "fstype": fields[dash + 1][:64],
        "source": unescape(fields[dash + 2])[:_POINT_MAX],
        "super": _options(fields[dash + 3]) if len(fields) > dash + 3 else [],
    }


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    return float(value)


def parse_stat(raw: object) -> dict[str, Any]:
    """One mount's statvfs fields -> {"free_pct", "free_mb", "inodes_free_pct"} (None where
    unknown), or {"hung": seconds} / {"error": name} as the source recorded them."""
    raw = _dict(raw)
    if "hung" in raw:
        return {"hung": _seconds(raw["hung"])}
    if "error" in raw:
        return {"error": clean(raw["error"], 32)}
    frsize, blocks, bfree, bavail, files, ffree = (
        _count(raw.get(k)) for k in ("frsize", "blocks", "bfree", "bavail", "files", "ffree")
    )
    out: dict[str, float | None] = {"free_pct": None, "free_mb": None, "inodes_free_pct": None}
    if blocks and bfree is not None and bavail is not None and blocks >= bfree:
        usable = blocks - bfree + bavail
        out["free_pct"] = 100.0 * bavail / usable if usable else None
        out["free_mb"] = bavail * frsize / (1 << 20) if frsize else None
    if files and ffree is not None:
        out["inodes_free_pct"] = 100.0 * min(ffree, files) / files
    return dict(out)


def parse_file(raw: object) -> dict[str, Any]:
    """One listed path as the source recorded it -> {"lmode", "mode", "size" (None where
    unknown), "access": {"r", "w", "x": bool}, "error", "hung"}: `mode` is stat(2)'s (a link
    followed), `lmode` lstat(2)'s; `error` why the path (or a link's target) could not be
    stat'ed, `hung` the seconds it did not answer in."""
    raw = _dict(raw)
    access = _dict(raw.get("access"))
    error = raw.get("error")
    return {
        "lmode": _count(raw.get("lmode")),
        "mode": _count(raw.get("mode")),
        "size": _count(raw.get("size")),
        "access": {k: access.get(k) is True for k in "rwx"},
        "error": clean(error, 32) if error is not None else None,
        "hung": _seconds(raw["hung"]) if "hung" in raw else None,
    }


def parse(raw: object) -> Facts:
    """Raw mountinfo lines, stats and files -> {"mounts": {point: mount}, "stats": {point:
    stat}, "files": {path: file}, "errors"}. The last line of a mount point wins: a mount
    mounted over another is on top."""
    raw = _dict(raw)
    lines = raw.get("mountinfo")
    mounts = {}
    for line in lines if isinstance(lines, list) else []:
        mount = parse_line(line)
        if mount is not None:
            mounts[mount["point"]] = mount
    return {
        "mounts": mounts,
        "stats": {str(k): parse_stat(v) for k, v in _dict(raw.get("stats")).items()},
        "files": {str(k): parse_file(v) for k, v in _dict(raw.get("files")).items()},
        "errors": {str(k)[:64]: clean(v, 64) for k, v in _dict(raw.get("errors")).items()},
    }


# ---------------------------------------------------------------- expectations and scope


def _expect(ctx: Context | dict[str, Any]) -> dict[str, Any]:
    return ctx.expect if isinstance(ctx, Context) else ctx


def _list(ctx: Context | dict[str, Any], key: str) -> list[str]:
    value = _expect(ctx).get(key)
    if value is None and key == "free_on":
        value = DEFAULTS["free_on"][0]
    return [str(v) for v in value] if isinstance(value, list) else []


def _map(ctx: Context | dict[str, Any], key: str) -> dict[str, Any]:
    """A map of path -> value (fstype, free_pct_at, free_mb_at, files), {} when unset."""
    value = _expect(ctx).get(key)
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}


def listed(expect: dict[str, Any]) -> list[str]:
    """Every mount point the expectations require mounted, each once, in order."""
    names = _list(expect, "mounts") + _list(expect, "rw") + _list(expect, "ro")
    return list(dict.fromkeys(names + list(_map(expect, "fstype"))))


def _floor_paths(expect: Context | dict[str, Any]) -> list[str]:
    """The paths whose mounts the free floors judge: free_on, and those with floors of their own."""
    own = list(_map(expect, "free_pct_at")) + list(_map(expect, "free_mb_at"))
    return list(dict.fromkeys(_list(expect, "free_on") + own))


def stat_paths(expect: dict[str, Any]) -> list[str]:
    """What the fs source must stat for these expectations: the listed mounts and the paths the
    floors judge (runner.run hands them to the source)."""
    return list(dict.fromkeys(listed(expect) + _floor_paths(expect)))


def file_paths(expect: dict[str, Any]) -> list[str]:
    """The paths the fs source must test (runner.run hands them to the source)."""
    return list(_map(expect, "files"))


def _judged(facts: Facts, ctx: Context) -> list[str]:
    """The mounts judged: those listed and present, and those holding the floors' paths."""
    mounts = facts["mounts"]
    found = [p for p in listed(ctx.expect) if p in mounts]
    held = [holder(path, mounts) for path in _floor_paths(ctx)]
    return list(dict.fromkeys(found + [p for p in held if p is not None]))


def _name(point: str) -> str:
    return clean(point, _NAME_MAX)


def _read_only(mount: Mount) -> bool:
    return "ro" in mount["options"] or "ro" in mount["super"]


def _verdict(
    fails: list[str], warns: list[str], data: dict[str, Any], action: str = DRAIN
) -> Result | None:
    if fails:
        return fail(summarize(fails + warns), data, action)
    if warns:
        return warn(summarize(warns), data)
    return None


# ---------------------------------------------------------------- checks


def mounted(facts: Facts, ctx: Context) -> Result:
    """Every required mount point is mounted, with its expected filesystem type."""
    wanted = listed(ctx.expect)
    if not wanted:  # ok, not skip: a skip is a row in the node's store on every run
        return ok("no mounts required")
    if not facts["mounts"]:
        return fail(f"mountinfo unreadable: {facts['errors'].get('mountinfo', 'empty')}")
    missing = [p for p in wanted if p not in facts["mounts"]]
    fails = [f"{_name(p)} not mounted" for p in missing]
    for point, kind in _map(ctx, "fstype").items():
        found = facts["mounts"].get(point)
        if found is not None and found["fstype"] != kind:
            fails.append(f"{_name(point)} is {clean(found['fstype'], 32)}, not {clean(kind, 32)}")
    data = {"missing": missing}
    return _verdict(fails, [], data) or ok(f"{counted(len(wanted), 'mount')} mounted", data)


def responsive(facts: Facts, ctx: Context) -> Result:
    """Every judged mount answers statvfs within stat_timeout: a hung or stale mount hangs jobs."""
    judged = [p for p in _judged(facts, ctx) if p in facts["stats"]]
    if not judged:
        return skip("no mount stat'ed")
    fails, warns = [], []
    for point in judged:
        stat = facts["stats"][point]
        if "hung" in stat:
            fails.append(f"{_name(point)} hung (no answer in {stat['hung']:g} s)")
        elif stat.get("error") in _BROKEN:
            fails.append(f"{_name(point)} {stat['error']}")
        elif "error" in stat:
            warns.append(f"{_name(point)} cannot be stat'ed: {stat['error']}")
    data = {"judged": judged}
    bad = _verdict(fails, warns, data)
    return bad or ok(f"{counted(len(judged), 'mount')} answered", data)


def writable(facts: Facts, ctx: Context) -> Result:
    """Mounts read-write or read-only as listed; a mount the kernel turned read-only fails."""
    mounts = facts["mounts"]
    fails, warns, remounted = [], [], []
    for point in _list(ctx, "rw"):
        if point in mounts and _read_only(mounts[point]):
            fails.append(f"{_name(point)} read-only, expected read-write")
    for point in _list(ctx, "ro"):
        if point in mounts and not _read_only(mounts[point]):
            warns.append(f"{_name(point)} read-write, expected read-only")
    for point in _judged(facts, ctx):
        mount = mounts[point]
        if "rw" in mount["options"] and "ro" in mount["super"] and point not in _list(ctx, "ro"):
            remounted.append(f"{_name(point)} turned read-only by the kernel (filesystem error?)")
    data = {"remounted": len(remounted)}
    if remounted:
        return fail(summarize(remounted + fails + warns), data, REBOOT)
    return _verdict(fails, warns, data) or ok("read-write and read-only as expected", data)


def _floor(point: str, key: str, facts: Facts, ctx: Context) -> float | None:
    """The floor of one mount: the highest of the paths on it with a floor of their own
    (`key`_at), else the global `key`."""
    own = [
        float(v)
        for path, v in _map(ctx, f"{key}_at").items()
        if isinstance(v, (int, float)) and holder(path, facts["mounts"]) == point
    ]
    if own:
        return max(own)
    value = ctx.expect.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def _floors(point: str, facts: Facts, ctx: Context) -> list[str]:
    """What is below its floor on one mount: free space % and MiB."""
    out = []
    stat = facts["stats"][point]
    pct, floor = stat.get("free_pct"), _floor(point, "free_pct", facts, ctx)
    if pct is not None and floor is not None and pct < floor:
        out.append(f"{_name(point)} {pct:.1f}% free (floor {floor:g}%)")
    mib, least = stat.get("free_mb"), _floor(point, "free_mb", facts, ctx)
    if mib is not None and least is not None and mib < least:
        out.append(f"{_name(point)} {mib:.0f} MiB free (floor {least:g} MiB)")
    return out


def _writable_stats(facts: Facts, ctx: Context) -> list[str]:
    """Judged mounts with space figures that can be written (a read-only one is full by design)."""
    stats = facts["stats"]
    return [
        p
        for p in _judged(facts, ctx)
        if p in stats and not _read_only(facts["mounts"][p]) and "free_pct" in stats[p]
    ]


def free_space(facts: Facts, ctx: Context) -> Result:
    """Free space on the judged filesystems above their floors (a mount's own, else free_pct).

    A mount's own floors are free_pct_at and free_mb_at; free_mb applies where set."""
    points = _writable_stats(facts, ctx)
    if not points:
        return skip("no writable mount stat'ed")
    fails = [line for p in points for line in _floors(p, facts, ctx)]
    data = {p: facts["stats"][p].get("free_pct") for p in points}
    text = f"free space above the floors on {counted(len(points), 'filesystem')}"
    return _verdict(fails, [], data) or ok(text, data)


def free_inodes(facts: Facts, ctx: Context) -> Result:
    """Free inodes on the judged filesystems above inodes_free_pct (where they have a limit)."""
    floor = ctx.expect.get("inodes_free_pct")
    stats = facts["stats"]
    points = [p for p in _writable_stats(facts, ctx) if stats[p]["inodes_free_pct"] is not None]
    if not points or floor is None:
        return ok("no inode limits to judge")
    data = {p: stats[p]["inodes_free_pct"] for p in points}
    fails = [
        f"{_name(p)} {v:.1f}% inodes free (floor {floor:g}%)" for p, v in data.items() if v < floor
    ]
    text = f"free inodes above the floor on {counted(len(points), 'filesystem')}"
    return _verdict(fails, [], data) or ok(text, data)


def passes(letter: str, found: dict[str, Any]) -> bool:
    """Whether one parsed path passes one test(1) test, as root runs it."""
    if letter == "L":
        return found["lmode"] is not None and modes.S_ISLNK(found["lmode"])
    mode = found["mode"]
    if mode is None:  # missing, or a link whose target is
        return False
    if letter in KINDS:
        return modes.S_IFMT(mode) == KINDS[letter]
    if letter == "s":
        return bool(found["size"])
    if letter in "rwx":
        return bool(found["access"][letter])
    return letter == "e"


def _file_problem(path: str, letters: str, found: dict[str, Any] | None) -> str | None:
    """Why one listed path fails, or None."""
    if found is None:
        return None
    if found["hung"] is not None:
        return f"{_name(path)} hung (no answer in {found['hung']:g} s)"
    if found["lmode"] is None:
        error = found["error"]
        return f"{_name(path)} missing" if error in (None, "ENOENT") else f"{_name(path)} {error}"
    failed = [letter for letter in letters if letter in FILE_TESTS and not passes(letter, found)]
    if not failed:
        return None
    said = ", ".join(f"{_TEST_NAMES[letter]} (-{letter})" for letter in failed)
    return f"{_name(path)} not {said}"


def files(facts: Facts, ctx: Context) -> Result:
    """Every listed path passes its test(1) tests (NHC check_file_test): a missing one fails.

    The tests: the letters of `files` (module docstring), as root runs them."""
    wanted = {path: str(letters) for path, letters in _map(ctx, "files").items()}
    if not wanted:  # ok, not skip: a skip is a row in the node's store on every run
        return ok("no files listed: not judged")
    unread = [path for path in wanted if path not in facts["files"]]
    problems = [_file_problem(p, t, facts["files"].get(p)) for p, t in wanted.items()]
    fails = [p for p in problems if p is not None]
    data = {"files": len(wanted), "failed": len(fails), "unread": [_name(p) for p in unread]}
    if fails:
        return fail(summarize(fails, " file"), data, DRAIN)
    if unread:  # only a replayed snapshot taken without them lacks a listed path
        return skip(f"not read: {_name(unread[0])} (not in the snapshot)", data)
    return ok(f"{counted(len(wanted), 'file')} as expected", data)


CHECKS = (mounted, responsive, writable, free_space, free_inodes, files)


# ---------------------------------------------------------------- memory and genconf


def _lasting(mount: Mount, autofs: list[str]) -> bool:
    """A mount an admin set up to stay: a whole filesystem of data (not a bind of a file or a
    folder, a tmpfs or a container's layers), outside the kernel's and the runtimes' trees and
    not under an automounter (autofs unmounts what is idle)."""
    point = mount["point"]
    if mount["fstype"] in PSEUDO or mount["fstype"] in _NO_GENCONF or mount["root"] != "/":
        return False
    if any(point == top or point.startswith(top + "/") for top in _NOT_MOUNTS):
        return False
    return not any(point.startswith(top.rstrip("/") + "/") for top in autofs)


def expectations(facts: Facts) -> dict[str, Any]:
    """What this (known-good) node implies: its lasting mounts, their types, which are
    read-write and which read-only."""
    autofs = [p for p, m in facts["mounts"].items() if m["fstype"] == "autofs"]
    kept = {p: m for p, m in sorted(facts["mounts"].items()) if _lasting(m, autofs)}
    if not kept:
        return {}
    out = {
        "mounts": list(kept),
        "rw": [p for p, m in kept.items() if not _read_only(m)],
        "ro": [p for p, m in kept.items() if _read_only(m)],
        "fstype": {p: m["fstype"] for p, m in kept.items()},
    }
    return {k: v for k, v in out.items() if v}


def expected(expect: dict[str, Any], found: object = None) -> bool:
    """The source is expected when the config lists mounts or files: then an unreadable one
    fails."""
    return bool(listed(expect) or _map(expect, "files"))
