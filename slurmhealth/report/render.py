"""The nightly report's HTML and Markdown, rendered by jinja2 from the one dict build() makes.

JSON is that dict itself, so the three formats carry the same numbers. HTML is autoescaped by
the template's name; Markdown escapes every value through `finalize`.
"""

from __future__ import annotations

import json
import os

from slurmhealth.core.result import counted, printable
from slurmhealth.report.build import FORMATS, ReportError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import jinja2

_MD_SPECIAL = str.maketrans(
    {
        "\\": "\\\\",
        "|": "\\|",
        "`": "\\`",
        "*": "\\*",
        "_": "\\_",
        "[": "\\[",
        "]": "\\]",
        "<": "&lt;",
        ">": "&gt;",
        "&": "&amp;",
    }
)


def md_escape(value: object) -> str:
    """One Markdown table cell: one printable line; `|`, backticks, emphasis, links and
    HTML-ish text shown as text, whatever a node name or a kernel log holds."""
    if value is None:
        return ""
    return printable(str(value)).translate(_MD_SPECIAL)


def html_text(value: object) -> object:
    """Every string that reaches the HTML page, before autoescape: printable, one line (the
    report is mailed and read in terminals too: no controls, no bidi overrides)."""
    return printable(value) if isinstance(value, str) else value


def number(value: object) -> str:
    """Counts with thousands separators; other numbers as the dict holds them; None: n/a."""
    if value is None:
        return "n/a"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def count_of(value: object, noun: str, nouns: str = "") -> str:
    """`1 node`, `1,024 nodes`: a count and its noun, singular only for one (result.counted),
    counts with thousands separators as `num` writes them."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return f"{number(value)} {nouns or noun + 's'}"
    return counted(value, noun, nouns, spec="," if isinstance(value, int) else "")


def _environment(fmt: str) -> jinja2.Environment:
    import jinja2  # noqa: PLC0415 - the admin side only; never the hot path

    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(here),
        autoescape=jinja2.select_autoescape(["html"]),  # by the template's name: report.html
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        # Markdown: every value that reaches the page is escaped, not only those remembered.
        finalize=md_escape if fmt == "md" else html_text,
    )
    env.filters["num"] = number
    env.filters["counted"] = count_of
    return env


def render(doc: dict, fmt: str) -> str:
    """The report in one format: JSON is the dict itself; HTML and Markdown render it; prom is
    its before-failure signals as Prometheus text (prometheus())."""
    if fmt == "json":
        return json.dumps(doc, indent=1) + "\n"
    if fmt == "prom":
        return prometheus(doc)
    if fmt not in FORMATS:
        raise ReportError(f"unknown format {fmt!r} (use {', '.join(FORMATS)})")
    template = _environment(fmt).get_template(f"report.{fmt}")
    return template.render(r=doc)




# --- the fleet's signals for node_exporter's textfile collector (head node) ----------------------

PROM_FAMILIES = (
    ("slurmhealth_fleet_lemon_score", ("node",), "Lemon score of each node the sweep flags"),
    (
        "slurmhealth_fleet_rising_counter_per_hour",
        ("node", "device", "counter", "basis"),
        "Errors per hour of each rising error counter (slurmhealth trends)",
    ),
    (
        "slurmhealth_fleet_slow_deficit_ratio",
        ("node", "probe", "figure", "unit"),
        "Share by which a node is worse than its peers' median (slurmhealth slow)",
    ),
    (
        "slurmhealth_fleet_held_back_jobs",
        ("node",),
        "Multi-node jobs each node held back in the lemon window's last 7 days (slurmhealth job)",
    ),
    (
        "slurmhealth_fleet_odd_node",
        ("node", "what", "value", "majority"),
        "1 for each node whose version or setting differs from its class majority",
    ),
    (
        "slurmhealth_fleet_unguarded_jobs",
        ("node",),
        "Jobs each node started in the last day with no run of slurmhealth's on record",
    ),
)


def _prom_label(value: object) -> str:
    """A label value as the text format wants it: one printable line (node names, versions and
    counter names come from node records), backslash and quote escaped."""
    text = printable(str(value if value is not None else ""))
    return text.replace("\\", "\\\\").replace('"', '\\"')


def prometheus(doc: dict) -> str:
    """The report's before-failure signals, one gauge family each: lemons, rising error
    counters, slow nodes, nodes that held jobs back, odd nodes and nodes that ran jobs with no
    run on record (the first 100 the report names), for node_exporter's textfile
    collector on the head node (docs/metrics.md). Every family is written with its HELP and
    TYPE even when empty."""
    rows: dict = {name: [] for name, _, _ in PROM_FAMILIES}
    for c in (doc.get("lemons") or {}).get("candidates") or []:
        rows["slurmhealth_fleet_lemon_score"].append(((c["node"],), c["score"]))
    for f in (doc.get("rising") or {}).get("list") or []:
        key = (f["node"], f["device"], f["counter"], f["basis"])
        rows["slurmhealth_fleet_rising_counter_per_hour"].append((key, f["rate_per_h"]))
    for f in (doc.get("slow") or {}).get("list") or []:
        key = (f["node"], f["probe"], f["figure"], f["unit"])
        rows["slurmhealth_fleet_slow_deficit_ratio"].append((key, f["deficit"]))
    for h in (doc.get("held_back") or {}).get("list") or []:
        rows["slurmhealth_fleet_held_back_jobs"].append(((h["node"],), h["jobs"]))
    for u in (doc.get("freshness") or {}).get("unguarded") or []:
        rows["slurmhealth_fleet_unguarded_jobs"].append(((u["node"],), u["jobs"]))
    for item in (doc.get("drift") or {}).get("items") or []:
        for d in item.get("differ") or []:
            key = (d["node"], item["what"], d["value"], item["majority"])
            rows["slurmhealth_fleet_odd_node"].append((key, 1))
    lines = []
    for name, labels, help_text in PROM_FAMILIES:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for values, number_ in sorted(rows[name], key=lambda r: [str(v) for v in r[0]]):
            body = ",".join(f'{k}="{_prom_label(v)}"' for k, v in zip(labels, values))
            lines.append(f"{name}{{{body}}} {float(number_):g}")
    return "\n".join(lines) + "\n"
