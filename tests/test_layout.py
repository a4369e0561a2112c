"""The layout's rules, read from the source: imports go one way (entry -> fleet/report -> node ->
core), no module imports itself back through others, the node side stays on the standard
library, the package never imports sim/ (what only tests, benchmarks and the demo use, outside
the package so that no install carries it), every check area and source keeps its interface,
and the store is the only home of SQL that writes its tables."""

from __future__ import annotations

import ast
import functools
import inspect
import os
import re
import sys

import pytest
from conftest import REPO, store_at_version

from slurmhealth.core import store
from slurmhealth.core.constants import PHASES
from slurmhealth.node import sources
from slurmhealth.node.checks import AREAS, REGISTRY

PACKAGE = os.path.join(REPO, "slurmhealth")
SIM = os.path.join(REPO, "sim")  # the simulated fleet: beside the package, never in it
# Lower layers never import higher ones. report may read the fleet's lemon signals; the
# fleet never renders a report.
RANK = {"core": 0, "node": 1, "fleet": 2, "report": 3, "cli": 4, "__main__": 4, "__init__": 0}
# What the node side may import beyond the standard library (each lazily, with a fallback).
NODE_THIRD_PARTY = {"pynvml", "tomli", "tomllib"}  # tomllib: stdlib from 3.11, guarded


def modules(top: str = PACKAGE) -> dict:
    """{dotted module name: path} of every module of the package (or of another tree at the
    checkout's root)."""
    out = {}
    for folder, _, files in os.walk(top):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = path
    return out


def imports_of(path: str, name: str) -> set:
    """Every module a file imports, at the top or inside a function, absolute names."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


MODULES = modules()
SIM_MODULES = modules(SIM)


@functools.cache
def graph() -> dict:
    """{module: {package modules it imports}}."""
    return {
        name: {m for m in imports_of(path, name) if m in MODULES and m != name}
        for name, path in MODULES.items()
    }


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_the_layers_are_the_packages_the_docs_draw():
    assert {layer(m) for m in MODULES} == set(RANK)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_one_way(module):
    mine = RANK[layer(module)]
    upward = [m for m in graph()[module] if RANK[layer(m)] > mine and layer(m) != "__init__"]
    assert upward == [], f"{module} imports a higher layer"


def test_no_import_cycles():
    edges = graph()
    seen: dict = {}

    def visit(node: str, path: list) -> None:
        if seen.get(node) == "done":
            return
        if seen.get(node) == "open":
            cycle = path[path.index(node) :] + [node]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        seen[node] = "open"
        for nxt in sorted(edges[node]):
            if not nxt.endswith(".__init__") and nxt.rpartition(".")[0] != node:
                visit(nxt, [*path, node])
        seen[node] = "done"

    for name in sorted(edges):
        visit(name, [])


def test_a_planted_upward_import_is_caught(tmp_path):
    """The rule's own control: the checker sees a function-level import of the CLI."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from slurmhealth.cli import cli\n")
    assert "slurmhealth.cli" in imports_of(str(bad), "slurmhealth.node.bad")


def stdlib_names() -> set:
    """The standard library's top-level modules (sys.stdlib_module_names from 3.10; on 3.9 what
    the interpreter's own library folder and built-ins hold)."""
    names = getattr(sys, "stdlib_module_names", None)
    if names is not None:
        return set(names)
    import sysconfig

    folder = sysconfig.get_paths()["stdlib"]
    found = {n[:-3] if n.endswith(".py") else n for n in os.listdir(folder)}
    found |= {n.split(".")[0] for n in os.listdir(os.path.join(folder, "lib-dynload"))}
    return found | set(sys.builtin_module_names)


def test_the_node_side_imports_only_the_standard_library():
    stdlib = stdlib_names() | {"__future__"}
    assert {"os", "sqlite3", "json"} <= stdlib and "click" not in stdlib
    for name, path in MODULES.items():
        if layer(name) not in ("node", "core") and name != "slurmhealth.__main__":
            continue
        foreign = {
            m.split(".")[0]
            for m in imports_of(path, name)
            if not m.startswith("slurmhealth") and m.split(".")[0] not in stdlib
        }
        assert foreign <= NODE_THIRD_PARTY, f"{name} imports {foreign - NODE_THIRD_PARTY}"


def test_the_simulator_is_outside_the_package():
    assert "sim.simulate" in SIM_MODULES
    assert not [m for m in MODULES if m.rpartition(".")[2] == "simulate"]


def sim_users(tree: dict) -> set:
    """The modules of `tree` that import anything of sim/."""
    return {
        name
        for name, path in tree.items()
        if any(m == "sim" or m.startswith("sim.") for m in imports_of(path, name))
    }


def test_the_package_never_imports_the_simulator():
    """No install carries sim/: a module of the package that imported it would fail there."""
    assert sim_users(MODULES) == set()


def test_a_planted_import_of_the_simulator_is_caught(tmp_path):
    """The rule's own control: a function-level import of sim/ from the package is seen."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from sim import simulate\n")
    assert sim_users({"slurmhealth.fleet.bad": str(bad)}) == {"slurmhealth.fleet.bad"}


def test_the_simulator_imports_the_package_and_the_standard_library_only():
    """sim/ may use every layer (it writes stores as the package does, scores with its policy),
    and nothing that a checkout with the package's own requirements lacks."""
    stdlib = stdlib_names() | {"__future__"}
    for name, path in SIM_MODULES.items():
        foreign = {
            m.split(".")[0]
            for m in imports_of(path, name)
            if m.split(".")[0] not in ("slurmhealth", "sim") and m.split(".")[0] not in stdlib
        }
        assert foreign == set(), f"{name} imports {foreign}"


# --- the check areas' interface (node/checks/__init__.py) ---------------------------------------

REQUIRED = {"parse": 1}
# absent: checks.baseline, expectations and expected give the default (nothing, nothing, never)
OPTIONAL = {
    "baseline": 1,
    "expectations": 1,
    "expected": 1,
    "versions_of": 1,
    "events_of": 2,
    "resets_of": 1,
}


@pytest.mark.parametrize("area", sorted(AREAS))
def test_every_area_keeps_the_interface(area):
    module = AREAS[area]
    assert module.AREA == area
    assert module.SOURCE in sources.REGISTRY
    assert isinstance(module.DEFAULTS, dict)
    for key, spec in module.DEFAULTS.items():
        assert isinstance(spec, tuple) and len(spec) == 3 and spec[2], f"{area}.{key}: no why"
    for name, arity in {**REQUIRED, **OPTIONAL}.items():
        func = getattr(module, name, None)
        if func is None and name in OPTIONAL:
            continue
        assert callable(func), f"{area} lacks {name}"
        params = inspect.signature(func).parameters.values()
        required = [p for p in params if p.default is inspect.Parameter.empty]
        assert len(required) == arity, f"{area}.{name} signature"
    for check in module.CHECKS:
        assert list(inspect.signature(check).parameters) == ["facts", "ctx"]
        assert (check.__doc__ or "").strip(), f"{area}.{check.__name__} has no catalogue line"
    extra = {
        n
        for n, v in vars(module).items()
        if n.endswith("_of") and callable(v) and n not in OPTIONAL
    }
    assert not extra, f"{area} contributes {extra}: add it to the interface (checks/__init__.py)"


def test_the_areas_a_job_hook_never_imports_are_those_whose_phases_leave_it_out():
    from slurmhealth.node import checks

    for area, module in AREAS.items():
        phases = getattr(module, "PHASES", PHASES)
        in_hooks = "prolog" in phases or "epilog" in phases
        assert (area in checks.LATER) == (not in_hooks), area
        assert (area in checks.HOOKED) == in_hooks, area
    assert list(AREAS) == list(checks.NAMES)
    assert all(checks.known(name) for name in REGISTRY)
    assert not checks.known("nvme.nothing") and not checks.known("nope.count")


def test_check_names_are_area_dot_function():
    assert all(re.fullmatch(r"[a-z]+\.[a-z_]+", name) for name in REGISTRY)


@pytest.mark.parametrize("source", sorted(sources.REGISTRY))
def test_every_source_registers_one_gather_of_options(source):
    import importlib

    module = importlib.import_module(sources.REGISTRY[source])
    assert list(inspect.signature(module.gather).parameters) == ["options"]


# --- the store is a layer -----------------------------------------------------------------------

_WRITE = re.compile(
    r"\b(INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE|DELETE\s+FROM|CREATE\s+(TABLE|INDEX)|ALTER\s+TABLE)\s+"
    r"(" + "|".join(store.TABLE) + r")\b",
    re.I,
)
# Where SQL may change the store's tables: the store itself, and the fleet's bulk merge,
# whose statements are built from the same spec (store.insert_sql, records.KINDS): the record
# format's merges, collect's watermarks, the rollup.
SQL_HOMES = {
    "slurmhealth.core.store",
    "slurmhealth.fleet.pgstore",  # the same store on PostgreSQL: its schema, fleet migrate
    "slurmhealth.fleet.records",
    "slurmhealth.fleet.collect",
    "slurmhealth.fleet.rollup",
}


def modules_with_sql(pattern: re.Pattern) -> set:
    """Modules of the package and of sim/ with a string constant (SQL text) that matches
    `pattern`."""
    found = set()
    for name, path in {**MODULES, **SIM_MODULES}.items():
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if pattern.search(node.value):
                    found.add(name)
    return found


def test_only_the_store_layer_writes_the_stores_tables():
    writers = modules_with_sql(_WRITE)
    assert writers <= SQL_HOMES, f"SQL writing the store outside it: {writers - SQL_HOMES}"


def test_no_positional_inserts():
    for name, path in MODULES.items():
        text = open(path, encoding="utf-8").read()
        assert not re.search(r"INTO\s+\w+\s+VALUES", text), f"{name}: a positional INSERT"


def test_the_docs_table_of_the_store_is_the_spec():
    with open(os.path.join(REPO, "docs", "store.md"), encoding="utf-8") as handle:
        assert store.markdown_tables() in handle.read()


def test_a_new_store_has_exactly_the_specs_columns(tmp_path):
    conn = store.connect(str(tmp_path / "s.db"))
    for table in store.TABLES:
        columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table.name})")]
        assert tuple(columns) == table.names()


def test_migrating_each_old_version_gives_the_same_columns(tmp_path):
    for version in range(1, store.SCHEMA_VERSION):
        path = str(tmp_path / f"v{version}.db")
        store_at_version(path, version).close()
        conn = store.connect(path)
        for table in store.TABLES:
            columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table.name})")]
            assert tuple(columns) == table.names(), (version, table.name)


_READ = re.compile(
    r"\b(SELECT\s[^;]*?\bFROM|JOIN)\s+(" + "|".join(store.TABLE) + r")\b",
    re.I,
)
# Where SQL may read the store's tables: the store itself, the reads several consumers share
# (fleet/queries.py), the reads that have one consumer beside it (the report's, the job
# summaries', history's, the notifier's, an RMA bundle's), the lemon signals query, the bulk
# export/import.
QUERY_HOMES = {
    "slurmhealth.core.store",
    "slurmhealth.fleet.pgstore",
    "slurmhealth.fleet.queries",
    "slurmhealth.report.reads",
    "slurmhealth.fleet.jobs",
    "slurmhealth.fleet.history",
    "slurmhealth.fleet.notify",
    "slurmhealth.fleet.rma",
    "slurmhealth.fleet.signals",
    "slurmhealth.fleet.records",
    "slurmhealth.fleet.collect",
    "slurmhealth.fleet.rollup",
}


def test_only_the_query_modules_read_the_stores_tables():
    readers = modules_with_sql(_READ)
    assert readers <= QUERY_HOMES, f"SQL reading the store outside it: {readers - QUERY_HOMES}"
