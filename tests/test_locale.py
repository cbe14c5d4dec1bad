"""The translation catalogs cannot drift: each ``django_idempotency/locale/<lang>/LC_MESSAGES``
holds a ``django.po`` with every string the package marks (Django's ``makemessages`` run on
a copy of the package finds no other, and the catalog has none it does not find), each one
translated, and a ``django.mo`` that is that ``.po`` compiled (``msgfmt --check``, which also
checks that every translation keeps its placeholders). ``make messages`` brings them up to
date after a marked string changes.
"""

from __future__ import annotations

import ast
import gettext
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_idempotency"
CATALOGS = sorted((PACKAGE / "locale").glob("*/LC_MESSAGES/django.po"))

#: An entry's identity: (msgctxt, msgid, msgid_plural).
Key = tuple[str | None, str, str | None]


def parse_po(text: str) -> dict[Key, tuple[list[str], set[str]]]:
    """The entries of a ``.po`` file (the header left out): their translations and flags."""
    entries: dict[Key, tuple[list[str], set[str]]] = {}
    fields: dict[str, str] = {}
    flags: set[str] = set()
    current = ""

    def flush() -> None:
        if fields.get("msgid"):
            key = (fields.get("msgctxt"), fields["msgid"], fields.get("msgid_plural"))
            strs = [v for k, v in sorted(fields.items()) if k.startswith("msgstr")]
            entries[key] = (strs, set(flags))
        fields.clear()
        flags.clear()

    for line in [*text.splitlines(), ""]:
        if not line.strip():
            flush()
        elif line.startswith("#,"):
            flags.update(flag.strip() for flag in line[2:].split(","))
        elif line.startswith("#"):
            continue
        elif line.startswith('"'):
            fields[current] += ast.literal_eval(line)
        else:
            current, _, value = line.partition(" ")
            fields[current] = ast.literal_eval(value)
    return entries


def test_there_is_a_catalog_besides_english() -> None:
    languages = {po.parent.parent.name for po in CATALOGS}
    assert languages - {"en"}, "no translation catalog in django_idempotency/locale/"
    for po in CATALOGS:
        assert po.with_suffix(".mo").is_file(), f"{po} has no compiled django.mo"


@pytest.mark.parametrize("po", CATALOGS, ids=lambda po: po.parent.parent.name)
def test_every_entry_is_translated(po: Path) -> None:
    entries = parse_po(po.read_text(encoding="utf-8"))
    assert len(entries) > 100
    untranslated = [key for key, (strs, _) in entries.items() if not all(strs)]
    fuzzy = [key for key, (_, flags) in entries.items() if "fuzzy" in flags]
    assert untranslated == [] and fuzzy == []


@pytest.mark.gettext
@pytest.mark.parametrize("po", CATALOGS, ids=lambda po: po.parent.parent.name)
def test_the_committed_mo_is_the_po_compiled(po: Path, tmp_path: Path) -> None:
    compiled = tmp_path / "django.mo"
    subprocess.run(["msgfmt", "--check", "-o", str(compiled), str(po)], check=True)
    with compiled.open("rb") as fresh, po.with_suffix(".mo").open("rb") as committed:
        expected = gettext.GNUTranslations(fresh)
        shipped = gettext.GNUTranslations(committed)
    assert shipped._catalog == expected._catalog  # type: ignore[attr-defined]


@pytest.mark.gettext
@pytest.mark.parametrize("po", CATALOGS, ids=lambda po: po.parent.parent.name)
def test_the_catalog_has_exactly_the_marked_strings(po: Path, tmp_path: Path) -> None:
    """``makemessages`` on a copy of the package (its Python modules and templates) finds
    the entries the catalog has, no more and no fewer."""
    copy = tmp_path / "django_idempotency"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("locale", "__pycache__"))
    (copy / "locale").mkdir()
    language = po.parent.parent.name
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    subprocess.run(
        [sys.executable, "-m", "django", "makemessages", "-l", language, "--no-obsolete"],
        cwd=copy,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    found = parse_po((copy / "locale" / language / "LC_MESSAGES" / "django.po").read_text())
    committed = parse_po(po.read_text(encoding="utf-8"))
    assert sorted(set(found) - set(committed), key=str) == [], "marked but not in the catalog"
    assert sorted(set(committed) - set(found), key=str) == [], "in the catalog, marked nowhere"
