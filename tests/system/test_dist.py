"""What the published files carry: the sdist and the wheel built from this checkout, their
metadata, and the README that PyPI shows.

The sdist holds the package and what building it needs, and no tests (they need the example
project, PostgreSQL and Redis, and run from a checkout); the wheel holds the package only.
Both are built once per run with ``python -m build --no-isolation`` (the ``dev`` extra
brings ``build`` and the backend), the wheel from the sdist, as ``pip`` would.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "django_idempotency"
#: In the sdist, beside the package (PKG-INFO, setup.cfg and the egg-info come from setuptools).
SDIST_TOP = {"pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "MANIFEST.in"}
NOT_SHIPPED = ("tests/", "example_project/", "benchmarks/", "docs/", "noxfile.py", ".ci/")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("build", reason="the dev extra is not installed")
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def sdist_names(dist: Path) -> set[str]:
    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = [m.name for m in archive.getmembers() if m.isfile()]
    # every entry sits under one top directory, <name>-<version>/
    assert {n.split("/", 1)[0] for n in names} == {sdist.name.removesuffix(".tar.gz")}
    return {n.split("/", 1)[1] for n in names}


def wheel_names(dist: Path) -> set[str]:
    (wheel,) = dist.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def metadata(dist: Path) -> Message:
    (wheel,) = dist.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(archive.read(name).decode())


def test_the_sdist_carries_the_package_and_no_tests(dist: Path) -> None:
    names = sdist_names(dist)
    shipped_not = sorted(n for n in names if n.startswith(NOT_SHIPPED))
    assert shipped_not == []
    top = {n for n in names if "/" not in n}
    assert top == SDIST_TOP | {"PKG-INFO", "setup.cfg"}
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    package = {n for n in names if n.startswith(PACKAGE + "/")}
    # the package as tracked in the checkout, every module and data file
    on_disk = {
        str(p.relative_to(ROOT))
        for p in (ROOT / PACKAGE).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert package == on_disk
    rest = names - top - package
    assert all(n.startswith(f"{PACKAGE}.egg-info/") for n in rest), sorted(rest)


def test_the_wheel_carries_the_package_with_its_data(dist: Path) -> None:
    names = wheel_names(dist)
    package = {n for n in names if n.startswith(PACKAGE + "/")}
    assert {n.split("/", 1)[0] for n in names - package} == {
        next(n.split("/", 1)[0] for n in names if ".dist-info/" in n)
    }
    # the wheel is built from the sdist: the same package files
    assert package == {n for n in sdist_names(dist) if n.startswith(PACKAGE + "/")}
    for needed in (
        "py.typed",
        "migrations/0001_initial.py",
        "templates/admin/django_idempotency/idempotencykey/release_confirmation.html",
        "templates/admin/django_idempotency/idempotencykey/forget_confirmation.html",
        "static/django_idempotency/admin.css",
        # the translations: the compiled catalog Django loads, and its source
        "locale/de/LC_MESSAGES/django.mo",
        "locale/de/LC_MESSAGES/django.po",
    ):
        assert f"{PACKAGE}/{needed}" in package


def test_classifiers_name_exactly_the_tested_versions(dist: Path) -> None:
    """Python and Django classifiers match the matrix (noxfile.py; the main combination of
    ``make test`` is one of its cells), and the bounds match its lowest cells."""
    pytest.importorskip("nox", reason="the dev extra is not installed")
    sys.path.insert(0, str(ROOT))
    try:
        import noxfile
    finally:
        sys.path.remove(str(ROOT))
    meta = metadata(dist)
    classifiers = meta.get_all("Classifier") or []
    pythons = {
        c.rpartition(" :: ")[2] for c in classifiers if re.fullmatch(r".*Python :: 3\.\d+", c)
    }
    djangos = {
        c.rpartition(" :: ")[2] for c in classifiers if c.startswith("Framework :: Django ::")
    }
    assert pythons == set(noxfile.PYTHONS)
    assert djangos == set(noxfile.DJANGO)
    lowest = min(noxfile.PYTHONS, key=lambda v: tuple(map(int, v.split("."))))
    assert meta["Requires-Python"] == ">=" + lowest
    requires = meta.get_all("Requires-Dist") or []
    assert "django<7,>=5.2" in requires
    assert 'djangorestframework>=3.15.2; extra == "drf"' in requires
    assert noxfile.DRF["3.15"] == "djangorestframework==3.15.2"


def test_the_version_is_written_once(dist: Path) -> None:
    """pyproject.toml takes the version from ``django_idempotency.__version__``; the built
    files carry that one."""
    import tomllib

    import django_idempotency

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert "version" not in project
    assert project["dynamic"] == ["version"]
    version = django_idempotency.__version__
    assert metadata(dist)["Version"] == version
    (sdist,) = dist.glob("*.tar.gz")
    assert sdist.name == f"django_idempotency-{version}.tar.gz"
    (wheel,) = dist.glob("*.whl")
    assert wheel.name.startswith(f"django_idempotency-{version}-")


def test_redis_extra_is_redis_py_alone(dist: Path) -> None:
    """``[redis]`` (REDIS_URL, or Django's own Redis cache) is redis-py alone; django-redis
    comes with ``[django-redis]``, for REDIS_CACHE_ALIAS on a django-redis cache."""
    requires = metadata(dist).get_all("Requires-Dist") or []

    def extra(name: str) -> set[str]:
        return {r.split(";")[0].strip() for r in requires if r.endswith(f'extra == "{name}"')}

    assert extra("redis") == {"redis>=5.0"}
    assert extra("django-redis") == {"redis>=5.0", "django-redis>=5.4"}


def test_project_urls(dist: Path) -> None:
    urls = dict(u.split(", ", 1) for u in metadata(dist).get_all("Project-URL") or [])
    repo = "https://github.com/django-idempotency/django-idempotency"
    assert urls["Source"] == repo
    assert urls["Issues"] == repo + "/issues"
    assert set(urls) == {"Documentation", "Source", "Issues", "Changelog"}


def test_readme_links_are_absolute() -> None:
    """PyPI shows README.md without the repository around it: a relative link breaks."""
    text = (ROOT / "README.md").read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code holds no links
    text = re.sub(r"`[^`]*`", "", text)
    links = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"<(\S+?)>", text)
    assert links
    relative = [link for link in links if not link.startswith("https://")]
    assert relative == []


@pytest.mark.redis
def test_the_installed_wheel_isolates_a_projects_suite_by_itself(
    dist: Path, tmp_path: Path
) -> None:
    """pytest finds the plugin through the wheel's ``pytest11`` entry point: a project's
    suite run with nothing but ``pytest`` (no ``-p``, no ``pytest_plugins``) has each test's
    Redis records apart. The wheel goes into a throwaway virtualenv of the test's own,
    which sees this environment's other packages (Django, DRF, pytest-django, redis-py)."""
    import sysconfig
    import uuid
    import zipfile

    import redis

    from ..support import services
    from ..support.shop import write_shop

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = (venv / "lib").glob("python*/site-packages")
    # this environment's packages, after the venv's own (and without their .pth files: no
    # editable checkout of the package comes along)
    (site / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    (wheel,) = dist.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    entry_points = next(site.glob("django_idempotency-*.dist-info")) / "entry_points.txt"
    assert "[pytest11]" in entry_points.read_text(encoding="utf-8")

    shop = write_shop(tmp_path / "shop")
    prefix = f"shop-{uuid.uuid4().hex[:12]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    env |= {"PYTHONPATH": str(shop), "SHOP_REDIS_URL": services.REDIS_URL, "SHOP_PREFIX": prefix}
    python = str(venv / "bin" / "python")
    try:
        result = subprocess.run(
            [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_charges.py"],
            cwd=shop,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        imported = subprocess.run(
            [python, "-c", "import django_idempotency as d; print(d.__file__)"],
            cwd=shop,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        client = redis.Redis.from_url(services.REDIS_URL)
        leftover = list(client.scan_iter(match=f"{prefix}*"))
        if leftover:
            client.delete(*leftover)
        client.close()
    assert imported.stdout.startswith(str(site)), imported.stdout  # the wheel's package
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout
    assert leftover == []
