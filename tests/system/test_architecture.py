"""What a newcomer relies on: docs/architecture.md's module map names every module of the
package, and only those; Django's transaction internals are read in one module; no import
cycle, no function body over 60 lines nor above a cyclomatic complexity of 15; the tests
mirror the package."""

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


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The package's modules ``path`` imports anywhere in it: at the top, in a function, or
    under ``TYPE_CHECKING`` (each is a dependency a reader follows)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
                break
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (migrations aside)."""
    paths = {
        _module_name(path): path for path in PACKAGE.rglob("*.py") if "migrations" not in path.parts
    }
    modules = set(paths)
    return {name: _imports(path, name, modules) for name, path in paths.items()}


def test_no_import_cycle() -> None:
    """No module reaches itself through the package's imports, counting deferred imports and
    those under ``TYPE_CHECKING``: each layer can be read, and changed, from the bottom up."""
    graph = import_graph()
    cycles: list[list[str]] = []
    done: set[str] = set()

    def visit(module: str, trail: list[str]) -> None:
        if module in trail:
            cycles.append([*trail[trail.index(module) :], module])
            return
        if module in done:
            return
        for imported in sorted(graph[module]):
            visit(imported, [*trail, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert cycles == []


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
