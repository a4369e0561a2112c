"""Memory and CPU checks from /proc/meminfo and /sys/devices/system/cpu (the `host` section of a
snapshot, sources/host.py).

What NHC's check_hw_physmem, check_hw_mem_free, check_hw_swap, check_hw_swap_free and
check_hw_cpuinfo judge, under the names a `config from-nhc` translation targets ([hw]
memory_gb, free_memory_gb, swap_gb, swap_free_gb, hugepages, cpus, sockets, threads_per_core).
Nothing is judged against a value the config does not set, except CPUs that are present but
offline (a warning): any node, a CI container included, passes on defaults.

Memory is MemTotal (Documentation/filesystems/proc.rst: "Total usable RAM (i.e. physical RAM
minus a few reserved bits and the kernel binary code)"), in GiB (2^30 bytes). It sits a little
below the DIMMs' size and moves by a few MiB between kernels and firmware, hence the tolerance:
`memory_tolerance_pct` 2.0. A lost DIMM takes 1/16 of the memory on a 16-DIMM node (6.25%),
1/32 on a 32-DIMM node (3.1%): both below the tolerance, so a lost DIMM or channel fails
(service), while a kernel update does not. A node with more memory than expected passes.

Free memory is MemAvailable (the kernel's estimate of what a new job can get without swapping,
proc.rst; MemFree + Buffers + Cached on kernels before 3.14). Below `free_memory_gb` fails
(drain): a job started there runs out (memory a dead job's processes or a full tmpfs hold).

CPUs: `cpus` is the CPUs online (as /proc/cpuinfo lists them, NHC's count of threads), a
differing count fails: fewer is CPUs or a socket lost (firmware disables a core after machine
checks: service), more a config that is out of date (drain). A CPU that is present but offline
warns, unless `online = false` or the kernel says SMT is off (smt/control off or forceoff: the
sibling threads are offline by design). `sockets` and `threads_per_core` (the online hardware
threads of a core: 1 with SMT off) fail when they differ.
"""

from __future__ import annotations

from slurmhealth.core.result import DRAIN, SERVICE, Result, clean, counted, fail, ok, skip, warn
from slurmhealth.node.checks.base import Context, summarize, uint
from slurmhealth.node.sources.host import cpulist

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

    from slurmhealth.node.checks.base import Facts, Schema

AREA = "hw"
SOURCE = "host"

DEFAULTS: Schema = {
    "memory_gb": (None, float, "MemTotal expected, GiB; less than the tolerance allows fails"),
    "memory_tolerance_pct": (
        2.0,
        float,
        "how far MemTotal may sit below memory_gb, %: under one DIMM of 16 or 32 (6.25%, 3.1%)",
    ),
    "free_memory_gb": (None, float, "MemAvailable floor, GiB (NHC check_hw_mem_free)"),
    "swap_gb": (None, float, "SwapTotal expected, GiB, within the tolerance (0: no swap)"),
    "swap_free_gb": (None, float, "SwapFree floor, GiB (NHC check_hw_swap_free)"),
    "hugepages": (None, int, "HugePages_Total expected (default size); jobs that map them fail"),
    "cpus": (None, int, "CPUs online expected (NHC check_hw_cpuinfo's threads)"),
    "online": (True, bool, "every present CPU online; false: offline CPUs are expected"),
    "sockets": (None, int, "CPU packages expected (NHC check_hw_cpuinfo's physical CPUs)"),
    "threads_per_core": (None, int, "online hardware threads per core expected (2: SMT on)"),
}

_KIB_PER_GIB = 1 << 20
_SMT_OFF = ("off", "forceoff")


# ---------------------------------------------------------------- parse (pure, never raises)


def _kib(value: object) -> int | None:
    """A meminfo value: "527988424 kB" -> 527988424; "0" -> 0 (the HugePages_ counts have no
    unit); anything else -> None."""
    return uint(value.split(" ")[0]) if isinstance(value, str) else None


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _gib(kib: int | None) -> float | None:
    return None if kib is None else kib / _KIB_PER_GIB


def _available(mem: dict[str, Any]) -> int | None:
    found = _kib(mem.get("MemAvailable"))
    if found is not None:
        return found
    parts = [_kib(mem.get(k)) for k in ("MemFree", "Buffers", "Cached")]
    return None if None in parts else sum(p or 0 for p in parts)


def _cpus(raw: dict[str, Any]) -> dict[str, Any]:
    online, present = cpulist(raw.get("online")), cpulist(raw.get("present"))
    sets = [cpulist(v) for v in _dict(raw.get("packages")).values()]
    known = [s for s in sets if s]
    threads = cpulist(raw.get("threads"))
    smt = raw.get("smt")
    return {
        "online": online,
        "present": present,
        "smt": clean(smt, 32) if isinstance(smt, str) else None,
        "sockets": len(known) if known and len(known) == len(sets) else None,
        "threads_per_core": len(threads) if threads else None,
    }


def parse(raw: object) -> Facts:
    """Raw meminfo strings and CPU lists -> {"memory_gb", "available_gb", "swap_gb",
    "swap_free_gb", "hugepages", "cpus": {...}, "errors"}; None where unknown. Pure and total."""
    raw = _dict(raw)
    mem = _dict(raw.get("meminfo"))
    errors = _dict(raw.get("errors"))
    return {
        "memory_gb": _gib(_kib(mem.get("MemTotal"))),
        "available_gb": _gib(_available(mem)),
        "swap_gb": _gib(_kib(mem.get("SwapTotal"))),
        "swap_free_gb": _gib(_kib(mem.get("SwapFree"))),
        "hugepages": _kib(mem.get("HugePages_Total")),
        "cpus": _cpus(_dict(raw.get("cpu"))),
        "errors": {str(k)[:64]: clean(v, 64) for k, v in errors.items()},
    }


# ---------------------------------------------------------------- checks


def _gb(value: float) -> str:
    return f"{value:.1f} GiB"


def _below(have: float, want: float, tolerance: float) -> bool:
    return have < want * (1 - tolerance / 100)


def memory(facts: Facts, ctx: Context) -> Result:
    """Physical memory (MemTotal) at least memory_gb, within the tolerance: less is a lost DIMM."""
    have, want = facts["memory_gb"], ctx.expect.get("memory_gb")
    if have is None:
        return warn("MemTotal unreadable") if want is not None else skip("MemTotal unreadable")
    data = {"memory_gb": round(have, 3), "expected": want}
    tolerance = ctx.expect.get("memory_tolerance_pct") or 0.0
    if want is not None and _below(have, want, tolerance):
        text = f"memory {_gb(have)}, expected {want:g} GiB (-{tolerance:g}%): a DIMM lost?"
        return fail(text, data, SERVICE)
    return ok(f"memory {_gb(have)}", data)


def free_memory(facts: Facts, ctx: Context) -> Result:
    """Memory available to a new job (MemAvailable) at least free_memory_gb, where set."""
    have, floor = facts["available_gb"], ctx.expect.get("free_memory_gb")
    if floor is None:  # what is available changes every run: said in the data only
        data = {"available_gb": None if have is None else round(have, 3)}
        return ok("no free memory floor set", data)
    if have is None:
        return warn("MemAvailable unreadable")
    data = {"available_gb": round(have, 3), "floor": floor}
    if have < floor:
        return fail(f"{_gb(have)} memory available (floor {floor:g} GiB)", data, DRAIN)
    return ok(f"{_gb(have)} available", data)


def swap(facts: Facts, ctx: Context) -> Result:
    """Swap as expected: SwapTotal near swap_gb, SwapFree at least swap_free_gb, where set."""
    total, free = facts["swap_gb"], facts["swap_free_gb"]
    want, floor = ctx.expect.get("swap_gb"), ctx.expect.get("swap_free_gb")
    if want is None and floor is None:
        return skip("no swap expected") if total is None else ok(_swap_text(total))
    if total is None or free is None:
        return warn("SwapTotal or SwapFree unreadable")
    tolerance = ctx.expect.get("memory_tolerance_pct") or 0.0
    fails, warns = [], []
    if want is not None and _below(total, want, tolerance):
        fails.append(f"swap {_gb(total)}, expected {want:g} GiB")
    elif want is not None and want == 0 and total > 0:
        warns.append(f"swap {_gb(total)}, expected none")
    if floor is not None and free < floor:
        fails.append(f"swap free {_gb(free)} (floor {floor:g} GiB)")
    data = {"swap_gb": round(total, 3), "swap_free_gb": round(free, 3)}
    if fails:
        return fail(summarize(fails + warns), data, DRAIN)
    return warn(warns[0], data) if warns else ok(f"{_swap_text(total)} as expected", data)


def _swap_text(total: float) -> str:
    return f"swap {_gb(total)}" if total else "no swap"


def hugepages(facts: Facts, ctx: Context) -> Result:
    """HugePages_Total equal to hugepages where set: jobs that map them fail without them."""
    have, want = facts["hugepages"], ctx.expect.get("hugepages")
    if want is None:
        return skip("no huge pages expected") if have is None else ok(f"{have} huge pages")
    if have is None:
        return warn("HugePages_Total unreadable")
    if have != want:
        return fail(f"{have} huge pages, expected {want}", {"hugepages": have}, DRAIN)
    return ok(f"{have} huge pages", {"hugepages": have})


def cpu_count(facts: Facts, ctx: Context) -> Result:
    """CPUs online equal to cpus, where set: fewer is a core or a socket lost (service)."""
    online, want = facts["cpus"]["online"], ctx.expect.get("cpus")
    if online is None:
        return warn("CPU online list unreadable") if want is not None else skip("no CPU list")
    data = {"online": len(online), "expected": want}
    if want is not None and len(online) < want:
        return fail(f"{counted(len(online), 'CPU')} online, expected {want}", data, SERVICE)
    if want is not None and len(online) > want:
        return fail(f"{counted(len(online), 'CPU')} online, expected {want}", data, DRAIN)
    return ok(f"{counted(len(online), 'CPU')} online", data)


def _spans(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5": a cpulist as the kernel writes one."""
    out, start = [], None
    for i, cpu in enumerate(cpus):
        if start is None:
            start = cpu
        if i + 1 == len(cpus) or cpus[i + 1] != cpu + 1:
            out.append(str(start) if start == cpu else f"{start}-{cpu}")
            start = None
    return ",".join(out)


def cpus_online(facts: Facts, ctx: Context) -> Result:
    """Every present CPU is online, unless online = false or the kernel switched SMT off."""
    cpus = facts["cpus"]
    if cpus["online"] is None or cpus["present"] is None:
        return skip("CPU lists unreadable")
    offline = sorted(set(cpus["present"]) - set(cpus["online"]))
    data = {"offline": _spans(offline), "smt": cpus["smt"]}
    if not offline:
        return ok(f"all {counted(len(cpus['present']), 'present CPU')} online", data)
    said = f"{counted(len(offline), 'CPU')} offline ({clean(_spans(offline), 60)})"
    if ctx.expect.get("online") is False or cpus["smt"] in _SMT_OFF:
        why = "SMT off" if cpus["smt"] in _SMT_OFF else "as expected"
        return ok(f"{said}: {why}", data)
    return warn(said, data)


def topology(facts: Facts, ctx: Context) -> Result:
    """Sockets and online threads per core as expected, where set: a socket lost, SMT changed."""
    cpus = facts["cpus"]
    fails, action = [], DRAIN
    for key, noun in (("sockets", "socket"), ("threads_per_core", "thread per core")):
        want, have = ctx.expect.get(key), cpus[key]
        if want is None:
            continue
        if have is None:
            fails.append(f"{key} unreadable")
        elif have != want:
            plural = noun.replace("thread", "threads")
            fails.append(f"{counted(have, noun, plural)}, expected {want}")
            if key == "sockets" and have < want:
                action = SERVICE
    data = {"sockets": cpus["sockets"], "threads_per_core": cpus["threads_per_core"]}
    if fails:
        return fail(summarize(fails), data, action)
    if cpus["sockets"] is None:
        return skip("CPU topology unreadable", data)
    threads = cpus["threads_per_core"]
    per_core = f", {counted(threads, 'thread')} per core" if threads else ""
    return ok(f"{counted(cpus['sockets'], 'socket')}{per_core}", data)


CHECKS = (memory, free_memory, swap, hugepages, cpu_count, cpus_online, topology)


# ---------------------------------------------------------------- memory and genconf


def expectations(facts: Facts) -> dict[str, Any]:
    """What this (known-good) node implies: its memory (GiB, one decimal, rounded down), swap
    and huge pages where it has them, its CPUs online, sockets and threads per core."""
    out: dict[str, Any] = {}
    if facts["memory_gb"]:
        out["memory_gb"] = int(facts["memory_gb"] * 10) / 10
    if facts["swap_gb"]:
        out["swap_gb"] = int(facts["swap_gb"] * 10) / 10
    if facts["hugepages"]:
        out["hugepages"] = facts["hugepages"]
    cpus = facts["cpus"]
    if cpus["online"]:
        out["cpus"] = len(cpus["online"])
    for key in ("sockets", "threads_per_core"):
        if cpus[key]:
            out[key] = cpus[key]
    return out


def expected(expect: dict[str, Any], found: object = None) -> bool:
    """The host's facts are expected when the config sets memory or CPU counts."""
    keys = ("memory_gb", "free_memory_gb", "swap_gb", "swap_free_gb", "hugepages", "cpus")
    return any(expect.get(k) is not None for k in (*keys, "sockets", "threads_per_core"))
