"""Mounted filesystems: `HOST_ROOT/proc/self/mountinfo`, then a bounded statvfs of each mount
the fs checks judge, and a bounded stat of each file they test.

`gather(options)` returns the `fs` section of a snapshot, so a replayed snapshot gives the same
verdicts as the live node:

    {"mountinfo": ["27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard", ...],
     "stats": {"/": {"frsize": 4096, "blocks": 65536000, "bfree": 50000000,
                     "bavail": 46000000, "files": 16384000, "ffree": 16000000, "flag": 4096},
               "/home": {"hung": 0.5},
               "/gone": {"error": "ENOENT"}},
     "files": {"/etc/slurm": {"lmode": 16877, "mode": 16877, "size": 4096,
                              "access": {"r": true, "w": true, "x": true}},
               "/etc/slurm/gone": {"error": "ENOENT"}},
     "errors": {"mountinfo": "EACCES"}}

mountinfo lines are kept as the kernel wrote them (proc(5), "/proc/pid/mountinfo"; its
`\\040`-style octal escapes included): checks/fs.py parses them. A mount's statvfs(3) runs in
its own daemon thread with its own deadline (`options.stat_timeout`), but for the local
filesystems whose statfs reads in-memory counters (IN_MEMORY: ext4, xfs, tmpfs, ...), which
are stat'ed in the gather's own thread: a hung NFS or Lustre
server makes statvfs block in the kernel, which no Python code can interrupt, so a mount that
does not answer in time is recorded as {"hung": seconds} and the gather goes on. A thread stuck
that way ends with the process (NFS waits are killable, Documentation/filesystems/nfs).

Which mounts are stat'ed: `options.mounts`, paths the fs checks name (the required ones, the
floors' defaults), each resolved to the mount that holds it; None (a snapshot) stats every
mount of a filesystem that stores data (not proc, sysfs, cgroup and the other pseudo
filesystems, nor autofs, whose stat would trigger a mount).

Which files are tested: `options.files`, the paths of [fs] files (None or none: no `files`
part). Each is lstat(2)'ed, stat(2)'ed where it is a symbolic link, and tested with access(2) for
R_OK, W_OK and X_OK, as test(1) tests them for the user the hooks run as (root): the raw facts
(both st_mode values, st_size, the three answers, or the errno's name) go to `files`, under the
same per-path deadline as a mount's statvfs, since a path on a hung NFS mount blocks its stat
just as the mount's statvfs. A path is read under `host_root`; a symbolic link there with an
absolute target resolves against this host's root, as the kernel resolves it.

`errors` is present only when something failed; nothing here raises on a broken tree.
"""

from __future__ import annotations

import os
import threading

from slurmhealth.node.sources import Options, errno_name

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    Stat = dict[str, object]  # one mount's statvfs fields, {"hung": s} or {"error": "ENOENT"}
    Probe = Callable[[str], Stat]  # a path -> its facts (the call bounded by a deadline)
    Running = tuple[str, threading.Thread, list[Stat]]  # a path, its thread, what it gave

# Filesystems that hold no data of their own: never stat'ed for a snapshot (autofs: a stat
# would mount what it guards; the rest report zero blocks). proc(5), Documentation/filesystems.
PSEUDO = frozenset(
    (
        "autofs", "binfmt_misc", "bpf", "cgroup", "cgroup2", "configfs", "debugfs", "devpts",
        "efivarfs", "fusectl", "hugetlbfs", "mqueue", "nsfs", "proc", "pstore", "rpc_pipefs",
        "securityfs", "selinuxfs", "sysfs", "tracefs",
    )
)
STAT_FIELDS = ("frsize", "blocks", "bfree", "bavail", "files", "ffree", "flag")
# Filesystems whose statfs answers from counters the kernel keeps in memory, with no I/O and no
# server to wait for (fs/ext4/super.c ext4_statfs: percpu counters and the in-memory superblock;
# fs/xfs/xfs_super.c xfs_fs_statfs: in-core counters; mm/shmem.c shmem_statfs; squashfs's
# superblock): stat'ed in the gather's own thread, where a thread per mount would cost a thread
# start each in every prolog. Network, cluster and FUSE filesystems (a dead server blocks
# statfs in the kernel) and the rest keep a thread and a deadline each.
IN_MEMORY = frozenset(("ext2", "ext3", "ext4", "xfs", "tmpfs", "squashfs"))
_READ_MAX = 4 << 20  # a mountinfo of thousands of mounts (a Kubernetes node) fits
_MOUNTS_MAX = 4096  # lines kept: a bound on the snapshot, far above any real node

# The calls that can hang on a dead server; tests replace them with ones that block.
statvfs: Callable[[str], os.statvfs_result] = os.statvfs
lstat: Callable[[str], os.stat_result] = os.lstat
# access(2)'s modes, by test(1)'s letters
ACCESS = (("r", os.R_OK), ("w", os.W_OK), ("x", os.X_OK))



def unescape(field: str) -> str:
    r"""A mountinfo path field as the path: the kernel writes space, tab, newline and backslash
    as octal escapes (`\040`, `\011`, `\012`, `\134`: fs/proc_namespace.c show_mountinfo's
    mangle). Anything that is not such an escape stays as it is."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and all(c in "01234567" for c in code):
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_point(line: str) -> tuple[str, str]:
    """(mount point, fstype) of one mountinfo line; ("", "") for a line that is not one.
    Fields: id parent major:minor root mount-point options [optional...] - fstype source super."""
    fields = line.split(" ")
    if len(fields) < 10 or "-" not in fields[6:]:
        return "", ""
    dash = fields.index("-", 6)
    return unescape(fields[4]), fields[dash + 1] if dash + 1 < len(fields) else ""


def holder(path: str, points: Iterable[str]) -> str | None:
    """The mount point that holds `path`: the longest that is `path` or a parent of it."""
    best = None
    for point in points:
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > len(best)):
            best = point
    return best


def _read_lines(path: str, errors: dict[str, str]) -> list[str]:
    try:
        with open(path, "rb") as handle:
            data = handle.read(_READ_MAX)
    except OSError as exc:
        errors["mountinfo"] = errno_name(exc)
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if len(lines) > _MOUNTS_MAX:
        errors["mountinfo"] = f"over {_MOUNTS_MAX} mounts: the first kept"
    return lines[:_MOUNTS_MAX]


def _statvfs(path: str) -> Stat:
    """One mount's statvfs fields, named without their f_ prefix."""
    got = statvfs(path)
    return {f: getattr(got, f"f_{f}") for f in STAT_FIELDS}


def _file(path: str) -> Stat:
    """One path's facts for test(1)'s tests: lstat's st_mode, stat's (a link followed: its
    target's, or why there is none), st_size and access(2)'s three answers."""
    import stat as modes  # noqa: PLC0415  (loaded by os already)

    got = lstat(path)
    out: Stat = {"lmode": got.st_mode}
    if modes.S_ISLNK(got.st_mode):
        try:
            got = os.stat(path)
        except OSError as exc:  # a dangling link: -L passes, the rest fail
            out["error"] = errno_name(exc)
            return out
    out["mode"], out["size"] = got.st_mode, got.st_size
    out["access"] = {letter: os.access(path, flag) for letter, flag in ACCESS}
    return out


def _probe(call: Probe, path: str, box: list[Stat]) -> None:
    try:
        box.append(call(path))
    except OSError as exc:
        box.append({"error": errno_name(exc)})


def start(paths: list[str], root: str, call: Probe) -> list[Running]:
    """`call` of each path (under `root`), each in its own daemon thread, started now."""
    running = []
    for path in paths:
        box: list[Stat] = []
        where = path if root == "/" else root.rstrip("/") + path
        thread = threading.Thread(target=_probe, args=(call, where, box), daemon=True)
        thread.start()
        running.append((path, thread, box))
    return running


def collect(running: list[Running], started: float, timeout: float) -> dict[str, Stat]:
    """What each started call gave within `timeout` seconds of `started` (time.monotonic):
    {path: facts | {"hung": timeout} | {"error": name}}."""
    import time  # noqa: PLC0415  (a builtin module, loaded already)

    out: dict[str, Stat] = {}
    for path, thread, box in running:
        thread.join(max(0.0, timeout - (time.monotonic() - started)))
        out[path] = box[0] if box else {"hung": timeout}
    return out


def stat_all(points: list[str], root: str, timeout: float) -> dict[str, Stat]:
    """statvfs of each mount point (under `root`), all at once, each bounded by `timeout`
    seconds from the start."""
    import time  # noqa: PLC0415  (a builtin module, loaded already)

    started = time.monotonic()
    return collect(start(points, root, _statvfs), started, timeout)


def types(lines: list[str]) -> dict[str, str]:
    """{mount point: its filesystem type}, the mount on top where one is mounted over another."""
    out = {}
    for line in lines:
        point, fstype = mount_point(line)
        if point:
            out[point] = fstype
    return out


def judged(lines: list[str], paths: Iterable[str] | None) -> list[str]:
    """The mount points to stat: those holding `paths`, or (None) every mount of a filesystem
    that stores data. Sorted, each once (a mount point mounted over twice is stat'ed once)."""
    return _judged(types(lines), paths)


def _judged(mounts: dict[str, str], paths: Iterable[str] | None) -> list[str]:
    if paths is None:
        return sorted(p for p, kind in mounts.items() if kind not in PSEUDO)
    found = {holder(p, mounts) for p in paths}
    return sorted(p for p in found if p is not None)


def gather(options: Options) -> dict[str, object]:
    """The registry's entry: mounts and their space under the configured host root."""
    import time  # noqa: PLC0415  (a builtin module, loaded already)

    root = options.host_root or "/"
    errors: dict[str, str] = {}
    lines = _read_lines(os.path.join(root, "proc", "self", "mountinfo"), errors)
    started = time.monotonic()  # the mounts and the files under one deadline, all at once
    kinds = types(lines)
    points = _judged(kinds, options.mounts)
    inline = [p for p in points if kinds.get(p) in IN_MEMORY]
    mounts = start([p for p in points if p not in inline], root, _statvfs)
    files = start(options.files or [], root, _file)
    stats = {}
    for point in inline:  # while the others' threads run
        box: list[Stat] = []
        _probe(_statvfs, point if root == "/" else root.rstrip("/") + point, box)
        stats[point] = box[0]
    stats.update(collect(mounts, started, options.stat_timeout))
    out: dict[str, object] = {"mountinfo": lines, "stats": dict(sorted(stats.items()))}
    if files:
        out["files"] = collect(files, started, options.stat_timeout)
    if errors:
        out["errors"] = errors
    return out
