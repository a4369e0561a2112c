"""The nightly report (admin side, may import jinja2): build the dict, render it, mail it."""
