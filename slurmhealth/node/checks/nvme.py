"""NVMe checks: controllers present and live, their SMART / Health log, their temperature.

Facts from sources/nvme.py: sysfs (sysfs-class-nvme; the controller's hwmon device,
drivers/nvme/host/hwmon.c) and, where nvme-cli is installed, `nvme smart-log -o json`. The
health check runs them, never a job hook (PHASES): a SMART log is an admin command to each
drive, and NVMe wear and media errors change over days, not between two jobs.

What the NVMe base specification's SMART / Health Information log (Log Identifier 02h) says,
and how it is judged:
- Critical Warning, bit 0: available spare below its threshold; bit 2: NVM subsystem
  reliability degraded by media errors or an internal error; bit 3: media placed in read-only
  mode; bit 4: volatile memory backup device failed. Each means the drive must be replaced:
  fail, service. Bit 1: a temperature above an over-temperature or below an under-temperature
  threshold: warn, as the room's or the fans' condition more than the drive's, which throttles
  itself; the temperature check names it.
- Percentage Used: the vendor's estimate of the endurance used, 100 at the rated life (it may
  exceed 100). Wear is planned replacement, not a fault: warn from `wear_warn_pct` (80: a
  replacement ordered while a fifth of the life is left).
- Available Spare below Available Spare Threshold: what bit 0 says, read from the values.
- Media and Data Integrity Errors: unrecovered data integrity errors (ECC, end-to-end
  protection): data a job read or wrote was lost. Any rise since the last health check
  fails, service.
- Number of Error Information Log Entries: every error the controller logged, most of them
  benign (an admin command a tool sent that the drive does not support is one): a rise warns.
The temperature: above the controller's own warning threshold (hwmon temp1_max, its WCTEMP)
or `temp_warn_c` when set warns; at or above its critical threshold (temp1_crit, CCTEMP) the
drive may shut down: fail. The controller's state (sysfs `state`): `live` is working;
`resetting` and `connecting` are a recovery under way (warn); `dead`, `deleting` and anything
else is a controller the kernel gave up on: fail.
"""

from __future__ import annotations

from slurmhealth.core.constants import CHECK, DIAG, HEALTHCHECK
from slurmhealth.core.result import DRAIN, SERVICE, Result, counted, fail, ok, skip, warn
from slurmhealth.node.checks.base import Context, summarize

TYPE_CHECKING = False  # typing stays unimported on the hook path; mypy reads the block below
if TYPE_CHECKING:
    from typing import Any

    from slurmhealth.node.checks.base import Facts, Schema

AREA = "nvme"
SOURCE = "nvme"
PHASES = (HEALTHCHECK, CHECK, DIAG)

DEFAULTS: Schema = {
    "count": (None, int, "NVMe controllers expected; unset: whatever is present"),
    "wear_warn_pct": (80, int, "percentage used (rated endurance) that warns: order a spare"),
    "temp_warn_c": (
        None,
        int,
        "composite temperature (C) that warns; unset: the drive's own warning threshold",
    ),
}

_NAME_MAX = 40
_KELVIN = 273
# Critical Warning bits (NVMe base specification, SMART / Health Information log, byte 0).
_REPLACE_BITS = {
    0: "available spare below threshold",
    2: "reliability degraded",
    3: "read-only",
    4: "volatile memory backup failed",
}
_TEMPERATURE_BIT = 1
_COUNTERS = ("media_errors", "num_err_log_entries")
_TRANSIENT = ("resetting", "connecting")


# ---------------------------------------------------------------- parse (pure, never raises)


def _str(value: object) -> str | None:
    return " ".join(value.split())[:_NAME_MAX] or None if isinstance(value, str) else None


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: object) -> int | None:
    """A number as sysfs or nvme-cli writes it: 41850, "41850", 3.0 -> int; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        body = text[1:] if text.startswith("-") else text
        if body and len(body) <= 40 and body.isascii() and body.isdigit():
            return int(text)
    return None


def _milli_c(value: object) -> float | None:
    number = _int(value)
    return number / 1000.0 if number is not None else None


def _smart(raw: object) -> dict[str, Any] | None:
    """The judged fields of an nvme-cli smart-log; None without one. `critical_warning` is an
    object with its `value` under `nvme smart-log -v` (json_smart_log's verbose form)."""
    if not isinstance(raw, dict):
        return None
    warning = raw.get("critical_warning")
    if isinstance(warning, dict):
        warning = warning.get("value")
    kelvin = _int(raw.get("temperature"))
    return {
        "critical_warning": _int(warning),
        "temp_c": kelvin - _KELVIN if kelvin else None,
        "avail_spare": _int(raw.get("avail_spare")),
        "spare_thresh": _int(raw.get("spare_thresh")),
        "percent_used": _int(raw.get("percent_used")),
        **{name: _int(raw.get(name)) for name in _COUNTERS},
    }


def _controller(raw: dict[str, Any]) -> dict[str, Any]:
    hwmon = _dict(raw.get("hwmon"))
    return {
        "state": _str(raw.get("state")),
        "model": _str(raw.get("model")),
        "serial": _str(raw.get("serial")),
        "firmware": _str(raw.get("firmware_rev")),
        "temp_c": _milli_c(hwmon.get("temp1_input")),
        "temp_max_c": _milli_c(hwmon.get("temp1_max")),
        "temp_crit_c": _milli_c(hwmon.get("temp1_crit")),
        "alarm": _int(hwmon.get("temp1_alarm")),
        "smart": _smart(raw.get("smart")),
        "smart_error": _str(raw.get("smart_error")),
    }


def parse(raw: object) -> Facts:
    """Raw sysfs strings and smart-logs -> {"controllers": {name: facts}, "tool": path|None}."""
    raw = _dict(raw)
    controllers = {
        str(name)[:_NAME_MAX]: _controller(_dict(ctrl))
        for name, ctrl in _dict(raw.get("controllers")).items()
    }
    tool = raw.get("tool") if isinstance(raw.get("tool"), str) else None
    return {"controllers": controllers, "tool": tool}


# ---------------------------------------------------------------- checks


def _expect(ctx: Context, key: str) -> int | None:
    value = ctx.expect.get(key)
    found: int | None = DEFAULTS[key][0] if value is None else value
    return found


def _none(facts: Facts) -> Result | None:
    return None if facts["controllers"] else skip("no NVMe controllers")


def present(facts: Facts, ctx: Context) -> Result:
    """Expected NVMe controllers present: a missing drive fell off the bus (service)."""
    found, want = len(facts["controllers"]), _expect(ctx, "count")
    data = {"count": found, "expected": want}
    if want is not None and found < want:
        return fail(f"{counted(found, 'NVMe controller')}, expected {want}", data, SERVICE)
    return _none(facts) or ok(f"{counted(found, 'NVMe controller')} present", data)


def state(facts: Facts, ctx: Context) -> Result:
    """Every NVMe controller live: dead or deleting fails, a reset under way warns."""
    states = {n: c["state"] for n, c in facts["controllers"].items()}
    gone = [f"{n} {s or 'unreadable'}" for n, s in states.items() if s not in ("live", *_TRANSIENT)]
    busy = [f"{n} {s}" for n, s in states.items() if s in _TRANSIENT]
    if gone:
        return fail(f"NVMe {summarize(gone + busy)}", states, SERVICE)
    if busy:
        return warn(f"NVMe {summarize(busy)}", states)
    return _none(facts) or ok(f"{counted(len(states), 'NVMe controller')} live", states)


def _logs(facts: Facts) -> tuple[dict[str, Any], str | None]:
    """({name: smart facts} of the controllers with a SMART log, why any is missing or None)."""
    logs = {n: c["smart"] for n, c in facts["controllers"].items() if c["smart"] is not None}
    if facts["tool"] is None:
        return logs, "nvme-cli not installed: SMART log not read (sysfs only)"
    missing = [f"{n}: {c['smart_error']}" for n, c in facts["controllers"].items()
               if c["smart"] is None]
    return logs, f"SMART log not read: {summarize(missing)}" if missing else None


def critical_warning(facts: Facts, ctx: Context) -> Result:
    """SMART critical warning: spare, reliability, read-only or backup bits fail (service)."""
    logs, why = _logs(facts)
    if not logs:
        return _none(facts) or skip(why or "no SMART log")
    bad, hot = [], []
    for name, log in logs.items():
        bits = log["critical_warning"] or 0
        bad += [f"{name} {what}" for bit, what in _REPLACE_BITS.items() if bits >> bit & 1]
        if bits >> _TEMPERATURE_BIT & 1:
            hot.append(f"{name} temperature warning")
    data = {n: log["critical_warning"] for n, log in logs.items()}
    if bad:
        return fail(f"NVMe {summarize(bad + hot)}", data, SERVICE)
    if hot:
        return warn(f"NVMe {summarize(hot)}", data)
    note = f"; {why}" if why else ""
    return ok(f"no critical warning on {counted(len(logs), 'NVMe controller')}{note}", data)


def endurance(facts: Facts, ctx: Context) -> Result:
    """Wear (percentage used) below nvme.wear_warn_pct and spare above its threshold."""
    logs, why = _logs(facts)
    if not logs:
        return _none(facts) or skip(why or "no SMART log")
    limit = _expect(ctx, "wear_warn_pct")
    low, worn = [], []
    for name, log in logs.items():
        spare, floor, used = log["avail_spare"], log["spare_thresh"], log["percent_used"]
        if spare is not None and floor is not None and spare < floor:
            low.append(f"{name} spare {spare}% below its threshold {floor}%")
        if used is not None and limit is not None and used >= limit:
            worn.append(f"{name} {used}% of its rated endurance used (warn at {limit}%)")
    data = {n: {"percent_used": g["percent_used"], "avail_spare": g["avail_spare"]}
            for n, g in logs.items()}
    if low:
        return fail(f"NVMe {summarize(low + worn)}", data, SERVICE)
    if worn:
        return warn(f"NVMe {summarize(worn)}", data)
    most = max((g["percent_used"] or 0 for g in logs.values()), default=0)
    return ok(f"NVMe wear at most {most}%, spare above threshold", data)


def _temperature(ctrl: dict[str, Any]) -> float | None:
    if ctrl["temp_c"] is not None:
        return float(ctrl["temp_c"])
    smart = ctrl["smart"] or {}
    return float(smart["temp_c"]) if smart.get("temp_c") is not None else None


def temperature(facts: Facts, ctx: Context) -> Result:
    """Composite temperature below the drive's warning threshold (or nvme.temp_warn_c)."""
    want = _expect(ctx, "temp_warn_c")
    hot, crit, data = [], [], {}
    for name, ctrl in facts["controllers"].items():
        now = _temperature(ctrl)
        if now is None:
            continue
        data[name] = now
        limit = want if want is not None else ctrl["temp_max_c"]
        if ctrl["temp_crit_c"] and now >= ctrl["temp_crit_c"]:
            crit.append(f"{name} {now:g} C, at its critical {ctrl['temp_crit_c']:g} C")
        elif (limit and now >= limit) or ctrl["alarm"]:
            hot.append(f"{name} {now:g} C" + (f" (warn at {limit:g} C)" if limit else ""))
    if crit:
        return fail(f"NVMe {summarize(crit + hot)}", data, DRAIN)
    if hot:
        return warn(f"NVMe {summarize(hot)}", data)
    if not data:
        return _none(facts) or skip("NVMe temperature not readable")
    return ok(f"NVMe at most {max(data.values()):g} C", data)


def _key(name: str, ctrl: dict[str, Any]) -> str:
    """A drive's key in the baseline: its serial (controller names can change at boot)."""
    return ctrl["serial"] or name


def errors(facts: Facts, ctx: Context) -> Result:
    """Media errors since the last health check fail (data lost); error-log entries warn."""
    logs, why = _logs(facts)
    if not logs:
        return _none(facts) or skip(why or "no SMART log")
    before = _dict(_dict(ctx.baseline).get("counters"))
    lost, logged, data, fresh = [], [], {}, 0
    for name, log in logs.items():
        then = _dict(before.get(_key(name, facts["controllers"][name])))
        if not then:
            fresh += 1
        deltas = {c: log[c] - then[c] for c in _COUNTERS
                  if isinstance(then.get(c), int) and log[c] is not None and log[c] > then[c]}
        data[name] = deltas
        if deltas.get("media_errors"):
            lost.append(f"{name} +{deltas['media_errors']} media errors (data lost)")
        if deltas.get("num_err_log_entries"):
            logged.append(f"{name} +{deltas['num_err_log_entries']} error log entries")
    if lost:
        return fail(f"NVMe {summarize(lost + logged)}", data, SERVICE)
    if logged:
        return warn(f"NVMe {summarize(logged)}", data)
    if fresh == len(logs):
        return ok("baseline recorded", data)
    return ok(f"no new NVMe errors on {counted(len(logs) - fresh, 'controller')}", data)


CHECKS = (present, state, critical_warning, endurance, temperature, errors)


# ---------------------------------------------------------------- memory and genconf


def baseline(facts: Facts, now: float | None = None) -> dict[str, Any]:
    """The error counters of every drive with a SMART log, by serial, for the next run."""
    counters = {
        _key(name, c): {k: c["smart"][k] for k in _COUNTERS if c["smart"][k] is not None}
        for name, c in facts["controllers"].items()
        if c["smart"] is not None
    }
    return {"counters": counters, "taken_at": now}


def versions_of(facts: Facts) -> dict[str, Any]:
    """The firmware of each drive (the nightly report's odd node out)."""
    firmware = {n: c["firmware"] for n, c in sorted(facts["controllers"].items()) if c["firmware"]}
    return {"nvme_fw": firmware} if firmware else {}


def expectations(facts: Facts) -> dict[str, Any]:
    """What this (known-good) node implies: its number of NVMe controllers."""
    count = len(facts["controllers"])
    return {"count": count} if count else {}


def expected(expect: dict[str, Any], found: object = None) -> bool:
    """NVMe is expected where the config names a count of controllers."""
    return bool(expect.get("count"))
