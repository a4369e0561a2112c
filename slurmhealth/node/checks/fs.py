"""Filesystem checks from mountinfo and statvfs (the `fs` section of a snapshot, sources/fs.py).

What NHC's check_fs_mount, check_fs_mount_rw/_ro, check_fs_free, check_fs_ifree and
check_fs_size judge, with the names a `config from-nhc` translation targets ([fs] mounts, rw,
ro, fstype, free_pct, free_mb, inodes_free_pct).

Which mounts are judged: every mount listed in `mounts`, `rw`, `ro` or `fstype`, plus the mounts
holding the `free_on` paths ("/", "/tmp", "/var" by default: where /tmp is on /, / is judged
once). A job writes its temporary files, its core dumps and its logs there: a full /tmp or /var
kills jobs on the node, so a filesystem below its floor fails (drain), as NHC does.

Floors, on judged mounts that can be written (a read-only mount, a squashfs image, is full by
design):
- free_pct 3.0: free space as df counts it, f_bavail / (f_blocks - f_bfree + f_bavail): the
  space a job (not root) may still use, so ext4's reserved blocks do not count as free. 3% is
  NHC's sample config's floor for / and /tmp (nhc.conf, check_fs_free / 3%).
- inodes_free_pct 3.0: free inodes, f_ffree / f_files; a filesystem that reports no inode limit
  (f_files 0: btrfs, some tmpfs) is not judged. A job that writes many small files runs out
  of inodes with space left.
- free_mb: an absolute floor in MiB, off by default; both floors apply where both are set.

Read-only: a mount listed in `rw` that is read-only fails (drain); one listed in `ro` that is
writable warns. With no list, a judged mount whose mount options say rw but whose superblock
says ro (mountinfo's super options) fails with reboot: the kernel remounted it after an error
(ext4's errors=remount-ro, XFS's shutdown), and a reboot runs the fsck it needs. A mount that
was mounted ro on purpose says ro in both places and is left alone.

A hung mount (statvfs not back within `stat_timeout`, a dead NFS or Lustre server) fails
(drain): jobs that touch it hang in the kernel. ESTALE, EIO and ENOTCONN (a stale NFS handle, a
failed disk, a FUSE daemon that died) fail the same way; other errors warn.
"""

from __future__ import annotations

from slurmhealth.core.result import DRAIN, REBOOT, Result, clean, counted, fail, ok, skip, warn
from slurmhealth.node.checks.base import Context, summarize
from slurmhealth.node.sources.fs import PSEUDO, holder, unescape

AREA = "fs"
SOURCE = "fs"

DEFAULTS = {
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
    "inodes_free_pct": (3.0, float, "free inode floor, %; a job of small files runs out first"),
    "stat_timeout": (
        0.5,
        float,
        "seconds a mount's statvfs may take before the mount is called hung (a dead NFS or "
        "Lustre server); keep it under settings.timeout_fs",
    ),
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


def parse_line(line: object) -> dict | None:
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


def _dict(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def parse_stat(raw: object) -> dict:
    """One mount's statvfs fields -> {"free_pct", "free_mb", "inodes_free_pct"} (None where
    unknown), or {"hung": seconds} / {"error": name} as the source recorded them."""
    raw = _dict(raw)
    if "hung" in raw:
        seconds = raw["hung"]
        return {"hung": seconds if isinstance(seconds, (int, float)) else 0.0}
    if "error" in raw:
        return {"error": clean(raw["error"], 32)}
    frsize, blocks, bfree, bavail, files, ffree = (
        _count(raw.get(k)) for k in ("frsize", "blocks", "bfree", "bavail", "files", "ffree")
    )
    out: dict = {"free_pct": None, "free_mb": None, "inodes_free_pct": None}
    if blocks and bfree is not None and bavail is not None and blocks >= bfree:
        usable = blocks - bfree + bavail
        out["free_pct"] = 100.0 * bavail / usable if usable else None
        out["free_mb"] = bavail * frsize / (1 << 20) if frsize else None
    if files and ffree is not None:
        out["inodes_free_pct"] = 100.0 * min(ffree, files) / files
    return out


def parse(raw: object) -> dict:
    """Raw mountinfo lines and stats -> {"mounts": {point: mount}, "stats": {point: stat},
    "errors"}. The last line of a mount point wins: a mount mounted over another is on top."""
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
        "errors": {str(k)[:64]: clean(v, 64) for k, v in _dict(raw.get("errors")).items()},
    }


# ---------------------------------------------------------------- expectations and scope


def _list(ctx: Context | dict, key: str) -> list[str]:
    expect = ctx.expect if isinstance(ctx, Context) else ctx
    value = expect.get(key)
    if key == "fstype":
        return [str(k) for k in value] if isinstance(value, dict) else []
    if value is None and key == "free_on":
        value = DEFAULTS["free_on"][0]
    return [str(v) for v in value] if isinstance(value, list) else []


def listed(expect: dict) -> list[str]:
    """Every mount point the expectations name, each once, in order."""
    names = _list(expect, "mounts") + _list(expect, "rw") + _list(expect, "ro")
    return list(dict.fromkeys(names + _list(expect, "fstype")))


def stat_paths(expect: dict) -> list[str]:
    """What the fs source must stat for these expectations: the listed mounts and the free_on
    paths (runner.run hands them to the source)."""
    return list(dict.fromkeys(listed(expect) + _list(expect, "free_on")))


def _judged(facts: dict, ctx: Context) -> list[str]:
    """The mounts judged: those listed and present, and those holding the free_on paths."""
    mounts = facts["mounts"]
    found = [p for p in listed(ctx.expect) if p in mounts]
    held = [holder(path, mounts) for path in _list(ctx, "free_on")]
    return list(dict.fromkeys(found + [p for p in held if p is not None]))


def _name(point: str) -> str:
    return clean(point, _NAME_MAX)


def _read_only(mount: dict) -> bool:
    return "ro" in mount["options"] or "ro" in mount["super"]


def _verdict(fails: list, warns: list, data: dict, action: str = DRAIN) -> Result | None:
    if fails:
        return fail(summarize(fails + warns), data, action)
    if warns:
        return warn(summarize(warns), data)
    return None


# ---------------------------------------------------------------- checks


def mounted(facts: dict, ctx: Context) -> Result:
    """Every required mount point is mounted, with its expected filesystem type."""
    wanted = listed(ctx.expect)
    if not wanted:  # ok, not skip: a skip is a row in the node's store on every run
        return ok("no mounts required")
    if not facts["mounts"]:
        return fail(f"mountinfo unreadable: {facts['errors'].get('mountinfo', 'empty')}")
    types = ctx.expect.get("fstype") or {}
    missing = [p for p in wanted if p not in facts["mounts"]]
    fails = [f"{_name(p)} not mounted" for p in missing]
    for point, kind in types.items():
        found = facts["mounts"].get(point)
        if found is not None and found["fstype"] != kind:
            fails.append(f"{_name(point)} is {clean(found['fstype'], 32)}, not {clean(kind, 32)}")
    data = {"missing": missing}
    return _verdict(fails, [], data) or ok(f"{counted(len(wanted), 'mount')} mounted", data)


def responsive(facts: dict, ctx: Context) -> Result:
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


def writable(facts: dict, ctx: Context) -> Result:
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


def _floors(point: str, stat: dict, ctx: Context) -> list[str]:
    """What is below its floor on one mount: free space % and MiB."""
    out = []
    pct, floor = stat.get("free_pct"), ctx.expect.get("free_pct")
    if pct is not None and floor is not None and pct < floor:
        out.append(f"{_name(point)} {pct:.1f}% free (floor {floor:g}%)")
    mib, least = stat.get("free_mb"), ctx.expect.get("free_mb")
    if mib is not None and least is not None and mib < least:
        out.append(f"{_name(point)} {mib:.0f} MiB free (floor {least:g} MiB)")
    return out


def _writable_stats(facts: dict, ctx: Context) -> list[str]:
    """Judged mounts with space figures that can be written (a read-only one is full by design)."""
    stats = facts["stats"]
    return [
        p
        for p in _judged(facts, ctx)
        if p in stats and not _read_only(facts["mounts"][p]) and "free_pct" in stats[p]
    ]


def free_space(facts: dict, ctx: Context) -> Result:
    """Free space on the judged filesystems above free_pct (and free_mb where set)."""
    points = _writable_stats(facts, ctx)
    if not points:
        return skip("no writable mount stat'ed")
    fails = [line for p in points for line in _floors(p, facts["stats"][p], ctx)]
    data = {p: facts["stats"][p].get("free_pct") for p in points}
    text = f"free space above the floors on {counted(len(points), 'filesystem')}"
    return _verdict(fails, [], data) or ok(text, data)


def free_inodes(facts: dict, ctx: Context) -> Result:
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


CHECKS = (mounted, responsive, writable, free_space, free_inodes)


# ---------------------------------------------------------------- memory and genconf


def baseline(facts: dict, now: float | None = None) -> dict:
    """Nothing to remember: every fs check judges the node as it is now."""
    return {}


def _lasting(mount: dict, autofs: list[str]) -> bool:
    """A mount an admin set up to stay: a whole filesystem of data (not a bind of a file or a
    folder, a tmpfs or a container's layers), outside the kernel's and the runtimes' trees and
    not under an automounter (autofs unmounts what is idle)."""
    point = mount["point"]
    if mount["fstype"] in PSEUDO or mount["fstype"] in _NO_GENCONF or mount["root"] != "/":
        return False
    if any(point == top or point.startswith(top + "/") for top in _NOT_MOUNTS):
        return False
    return not any(point.startswith(top.rstrip("/") + "/") for top in autofs)


def expectations(facts: dict) -> dict:
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


def expected(expect: dict, found: object = None) -> bool:
    """The mounts are expected when the config lists any: then an unreadable source fails."""
    return bool(listed(expect))
