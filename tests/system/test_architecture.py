"""What a newcomer relies on: docs/architecture.md's module map names every module of the
package, and only those; its layers are :data:`LAYERS`, and no import points up one or makes
a cycle, between folders or between modules; Django's transaction internals are read in one
module; no function body over 60 lines nor above a cyclomatic complexity of 15; the tests
mirror the package.

``python tests/system/test_architecture.py [ROOT]`` prints the import graph's figures (the
upward arrows and the cycles) for this tree or the one at ROOT."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_idempotency"


def mapped_modules() -> set[str]:
    """The paths the map's ``text`` block lists, relative to the package."""
    markdown = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = markdown.split("## Where things live", 1)[1]
    block = section.split("```text\n", 1)[1].split("```", 1)[0]
    found: set[str] = set()
    folders: list[tuple[int, str]] = []  # (indent, folder) of the enclosing folders
    for line in block.splitlines()[1:]:  # the first line is the package itself
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        name = line.split()[0]
        while folders and folders[-1][0] >= indent:
            folders.pop()
        prefix = "".join(folder for _indent, folder in folders)
        if name.endswith("/"):
            folders.append((indent, name))
        elif re.fullmatch(r"[\w/]+\.py", name):
            found.add(prefix + name)
    return found


def package_modules() -> set[str]:
    """Every module of the package but the migrations and the bare package markers."""
    return {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "migrations" not in path.parts
        and not (path.name == "__init__.py" and path.stat().st_size == 0)
    }


def test_every_module_has_its_line_in_the_map() -> None:
    assert sorted(package_modules() - mapped_modules()) == []


def test_the_map_names_no_module_that_does_not_exist() -> None:
    assert sorted(mapped_modules() - package_modules()) == []


def test_one_module_per_line() -> None:
    markdown = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = markdown.split("## Where things live", 1)[1].split("```text\n", 1)[1]
    block = block.split("```", 1)[0]
    crowded = [line for line in block.splitlines() if len(re.findall(r"\.py\b", line)) > 1]
    assert crowded == []


def _body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function's body, from its first statement after the docstring to its end."""
    body = function.body
    first = body[0]
    is_docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    start = body[1].lineno if is_docstring and len(body) > 1 else first.lineno
    return int(function.end_lineno or start) - start + 1


def test_no_function_body_over_sixty_lines() -> None:
    """The house rule, over the whole package (migrations aside)."""
    long: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _body_lines(node) > 60:
                long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    assert long == []


def test_no_function_above_a_cyclomatic_complexity_of_fifteen() -> None:
    """A function with more paths than that is split (radon's McCabe count, as `radon cc`
    prints it), migrations aside."""
    from radon.complexity import cc_visit

    tangled: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for block in cc_visit(path.read_text(encoding="utf-8")):
            for scored in [block, *getattr(block, "methods", [])]:
                if scored.complexity > 15:
                    tangled.append(f"{path.relative_to(PACKAGE)}:{scored.lineno} {scored.name}")
    assert tangled == []


def test_the_store_does_not_import_the_models() -> None:
    """models.py imports the store's managers; the store relies on ``self.model`` and the
    app registry, so that no import of the models module (even a deferred one, even under
    TYPE_CHECKING) makes a cycle."""
    importing: list[str] = []
    for path in sorted((PACKAGE / "store").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = {alias.name for alias in node.names}
                module = node.module or ""
                if (module.endswith("models") and "idempotency" in module) or (
                    node.level and (module == "models" or (module == "" and "models" in names))
                ):
                    importing.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
            elif isinstance(node, ast.Import) and any(
                alias.name == "django_idempotency.models" for alias in node.names
            ):
                importing.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert importing == []


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The package's modules ``path`` imports anywhere in it: at the top, in a function, or
    under ``TYPE_CHECKING`` (each is a dependency a reader follows). ``from P import n``
    imports ``P``, whose ``__init__`` runs and may hand ``n`` on (a re-export is an import
    of the package), and also ``P.n`` when that is a module; the top package, which Python
    runs before any of its modules, only when ``n`` is a name it defines."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            submodules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            top = base == "django_idempotency" and len(submodules) == len(node.names)
            targets = [*([] if top else [base]), *submodules]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (migrations aside)."""
    package = root / "django_idempotency"
    paths = {
        _module_name(path, root): path
        for path in package.rglob("*.py")
        if "migrations" not in path.parts
    }
    modules = set(paths)
    return {name: _imports(path, name, modules) for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle of ``graph``, each once: from its smallest node, back to it."""
    found: list[list[str]] = []

    def visit(start: str, trail: list[str]) -> None:
        for following in sorted(graph.get(trail[-1], ())):
            if following == start:
                found.append([*trail, start])
            elif following > start and following not in trail:
                visit(start, [*trail, following])

    for start in sorted(graph):
        visit(start, [start])
    return found


def test_no_import_cycle() -> None:
    """No module reaches itself through the package's imports, counting deferred imports,
    those under ``TYPE_CHECKING`` and re-exports: each layer can be read, and changed, from
    the bottom up."""
    assert cycles(import_graph()) == []


# -- the layers (docs/architecture.md, "Layers") ---------------------------------------------

#: The package's layers, top to bottom, each a few of its top-level modules and folders (a
#: folder is one node, whatever it holds; the migrations aside). A node imports nodes of its
#: own layer or of the layers below, never one above; no two nodes import each other, even
#: through others. docs/architecture.md's "Layers" block is this list, line for line.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "entry points",
        ("__init__.py", "apps.py", "admin.py", "management/", "testing/", "contrib/", "metrics.py"),
    ),
    ("checks", ("checks/",)),
    (
        "adapters",
        (
            "drf.py",
            "middleware.py",
            "decorators.py",
            "mixins.py",
            "browsable.py",
            "idempotent_tasks.py",
            "completer.py",
            "completer_tasks.py",
        ),
    ),
    ("protocol", ("protocol/",)),
    ("strategies", ("strategies/",)),
    ("tasks", ("tasks.py",)),
    ("models", ("models.py",)),
    ("store", ("store/",)),
    ("values", ("values/",)),
    ("settings", ("errors.py", "signals.py", "conf.py")),
)


def folder_of(module: str, root: Path = ROOT) -> str:
    """The node ``module`` belongs to: its top-level folder (``store/``) or module
    (``conf.py``); ``__init__.py`` for the package itself."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__.py"
    if (root / "django_idempotency" / parts[0]).is_dir():
        return parts[0] + "/"
    return parts[0] + ".py"


def folder_graph(root: Path = ROOT) -> dict[str, dict[str, list[str]]]:
    """Node -> the nodes it imports -> the imports behind each arrow (``module -> module``)."""
    graph: dict[str, dict[str, list[str]]] = {}
    for module, imported in import_graph(root).items():
        here = folder_of(module, root)
        arrows = graph.setdefault(here, {})
        for target in sorted(imported):
            there = folder_of(target, root)
            if there != here:
                arrows.setdefault(there, []).append(f"{module} -> {target}")
    return graph


def upward_arrows(root: Path = ROOT) -> list[str]:
    """The imports from a node to a node of a higher layer (or of no layer)."""
    level = {node: index for index, (_name, nodes) in enumerate(LAYERS) for node in nodes}
    up: list[str] = []
    for here, arrows in sorted(folder_graph(root).items()):
        for there, imports in sorted(arrows.items()):
            if level.get(there, -1) < level.get(here, len(LAYERS)):
                up.extend(f"{here} -> {there}: {line}" for line in imports)
    return up


def layer_report(root: Path = ROOT) -> str:
    """The figures of the import graph, for a tree at ``root``: ``python
    tests/system/test_architecture.py [ROOT]`` prints them."""
    graph = folder_graph(root)
    folder_cycles = cycles({node: set(arrows) for node, arrows in graph.items()})
    up = upward_arrows(root)
    arrows = {line.split(":")[0] for line in up}
    lines = [
        f"upward arrows (node -> node): {len(arrows)}, imports behind them: {len(up)}",
        *(f"  {line}" for line in up),
        f"cycles between folders and top-level modules: {len(folder_cycles)}",
        *(f"  {' -> '.join(cycle)}" for cycle in folder_cycles),
        f"cycles between modules: {len(cycles(import_graph(root)))}",
    ]
    return "\n".join(lines)


def test_every_node_has_its_layer() -> None:
    nodes = {folder_of(module) for module in import_graph()}
    placed = [node for _name, layer in LAYERS for node in layer]
    assert sorted(nodes - set(placed)) == []
    assert sorted(set(placed) - nodes) == []
    assert len(placed) == len(set(placed))


def test_no_import_points_up_a_layer() -> None:
    assert upward_arrows() == []


def test_no_cycle_between_folders() -> None:
    graph = folder_graph()
    assert cycles({node: set(arrows) for node, arrows in graph.items()}) == []


def test_the_architecture_page_lists_the_layers() -> None:
    """docs/architecture.md's "Layers" block: one line per layer, top first, its name then
    its nodes, as :data:`LAYERS` has them."""
    markdown = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = markdown.split("## Layers", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    listed: list[tuple[str, tuple[str, ...]]] = []
    for line in block.splitlines():
        if line.startswith(" ") and listed:  # a layer's nodes go on over several lines
            layer, nodes = listed.pop()
            listed.append((layer, (*nodes, *line.split())))
        elif line.strip():
            layer, _colon, names = line.partition(":")
            listed.append((layer.strip(), tuple(names.split())))
    assert listed == list(LAYERS)


#: Django's transaction internals: read only through protocol/transactions.py, whose tests
#: pin their meaning on every Django version of the matrix.
DJANGO_INTERNALS = (
    "atomic_blocks",
    "savepoint_ids",
    "_from_testcase",
    "needs_rollback",
    "closed_in_transaction",
    "run_on_commit",
)


def test_django_transaction_internals_are_read_in_one_module() -> None:
    reading: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "protocol" / "transactions.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in DJANGO_INTERNALS:
                reading.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.attr}")
            elif isinstance(node, ast.Constant) and node.value in DJANGO_INTERNALS:
                reading.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value!r}")
    assert reading == []


def test_only_the_dialects_compare_vendor_names() -> None:
    """Above ``store/sql/`` the code asks a dialect's features (``features_of``), as
    Django's backends have ``features.py``: a new vendor is one dialect module and its
    snapshot tests. The migrations, which must not change with the code, aside."""
    comparing: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[:2] == ("store", "sql") or relative.parts[0] == "migrations":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare) and any(
                isinstance(side, ast.Attribute) and side.attr == "vendor"
                for side in (node.left, *node.comparators)
            ):
                comparing.append(f"{relative}:{node.lineno}")
    assert comparing == []


def test_only_the_store_clock_takes_djangos_now() -> None:
    """One clock: what goes through the ORM takes the database's now from
    ``store.clock.DatabaseNow``. Django's ``Now()`` is the session's local time on MariaDB
    and MySQL (``CURRENT_TIMESTAMP(6)``) while Django keeps datetimes there in UTC, so a
    session in another time zone would move every lease and expiry it stamps or compares."""
    taking: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative == Path("store", "clock.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "django.db.models.functions":
                taking += [f"{relative}:{node.lineno}" for a in node.names if a.name == "Now"]
            elif isinstance(node, ast.Attribute) and node.attr == "Now":
                taking.append(f"{relative}:{node.lineno}")
    assert taking == []


#: What users import: the modules docs/api.md must name.
PUBLIC = (
    "conf",
    "errors",
    "signals",
    "models",
    "mixins",
    "drf",
    "decorators",
    "middleware",
    "metrics",
    "tasks",
    "idempotent_tasks",
    "completer",
    "completer_tasks",
    "testing",
    "testing.plugin",
    "contrib.spectacular",
    "protocol.replay",
    "protocol.problems",
    "strategies.base",
    "protocol.lifecycle",
)


def test_public_modules_are_named_in_the_api_reference() -> None:
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    missing = [m for m in PUBLIC if f"django_idempotency.{m}" not in api]
    assert missing == []
    assert all(
        (PACKAGE / m.replace(".", "/")).with_suffix(".py").exists()
        or (PACKAGE / m.replace(".", "/") / "__init__.py").exists()
        for m in PUBLIC
    )


# -- the tests mirror the package (CONTRIBUTING.md, "Where the tests live") --------------------

TESTS = ROOT / "tests"
#: The folders of tests/ that mirror no folder of the package: the whole-system suites, the
#: support layer, the test app, the docs' examples (tests written as a project writes them)
#: and the SQL snapshots.
NOT_MIRRORED = {"system", "support", "testapp", "examples", "snapshots"}


def _counterpart(test: Path) -> Path | None:
    """The module or folder of the package that ``tests/<folder>/test_<name>.py`` tests:
    ``django_idempotency/<folder>/<name>.py`` or ``<name>/``, where ``<name>`` may be followed
    by ``_<what the file adds>`` (``test_decorators_async.py`` tests ``decorators.py``)."""
    folder = PACKAGE.joinpath(*test.relative_to(TESTS).parent.parts)
    words = test.stem.removeprefix("test_").split("_")
    for count in range(len(words), 0, -1):
        name = "_".join(words[:count])
        for candidate in (folder / f"{name}.py", folder / name):
            if candidate.exists() and candidate.name != "__init__.py":
                return candidate
    return None


def _mirrored_tests() -> list[Path]:
    return sorted(
        path
        for path in TESTS.rglob("test_*.py")
        if path.relative_to(TESTS).parts[0] not in NOT_MIRRORED
    )


def test_every_test_module_mirrors_what_it_tests() -> None:
    tests = _mirrored_tests()
    assert len(tests) > 30
    strays = [str(path.relative_to(ROOT)) for path in tests if _counterpart(path) is None]
    assert strays == [], "move each to tests/<folder>/test_<module>.py or to tests/system/"


def test_every_folder_of_tests_is_a_package_and_mirrors_one() -> None:
    folders = {path.parent for path in TESTS.rglob("test_*.py")} - {TESTS}
    strays = [
        str(folder.relative_to(ROOT))
        for folder in sorted(folders)
        if not (folder / "__init__.py").is_file()
        or (
            folder.relative_to(TESTS).parts[0] not in NOT_MIRRORED
            and not PACKAGE.joinpath(*folder.relative_to(TESTS).parts).is_dir()
        )
    ]
    assert strays == []


if __name__ == "__main__":
    import sys

    print(layer_report(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT))
