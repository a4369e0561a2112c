"""The nightly report's HTML and Markdown, rendered by jinja2 from the one dict build() makes.

JSON is that dict itself, so the three formats carry the same numbers. HTML is autoescaped by
the template's name; Markdown escapes every value through `finalize`.
"""

from __future__ import annotations

import json
import os

from slurmhealth.report.build import FORMATS, ReportError

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
    """One Markdown table cell: one line; `|`, backticks, emphasis, links and HTML-ish text
    shown as text, whatever a node name or a kernel log holds."""
    if value is None:
        return ""
    text = "".join(" " if ch.isspace() else ch for ch in str(value))
    return text.translate(_MD_SPECIAL)


def number(value: object) -> str:
    """Counts with thousands separators; other numbers as the dict holds them; None: n/a."""
    if value is None:
        return "n/a"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _environment(fmt: str) -> object:
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
        finalize=md_escape if fmt == "md" else None,
    )
    env.filters["num"] = number
    return env


def render(doc: dict, fmt: str) -> str:
    """The report in one format: JSON is the dict itself; HTML and Markdown render it."""
    if fmt == "json":
        return json.dumps(doc, indent=1) + "\n"
    if fmt not in FORMATS:
        raise ReportError(f"unknown format {fmt!r} (use {', '.join(FORMATS)})")
    template = _environment(fmt).get_template(f"report.{fmt}")  # type: ignore[attr-defined]
    return template.render(r=doc)


