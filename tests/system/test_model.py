"""The Promela model of the protocol (model/protocol.pml, checked by ``make model``) names
the code each of its steps stands for, in comments ``code: module.attribute, ...`` relative
to the package: every name must exist, so that renaming or removing a step of the protocol
shows up as a change of the model too. Spin itself runs in ``make model``, not here."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "model" / "protocol.pml"

DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+"
#: ``code:`` then dotted names separated by commas, a list that may go on over the comment's
#: next lines (`` * `` continues them).
REFERENCE = re.compile(rf"code:\s*(?:\*\s*)?({DOTTED}(?:,\s*(?:\*\s*)?{DOTTED})*)")


def references() -> list[str]:
    text = MODEL.read_text(encoding="utf-8")
    names: list[str] = []
    for match in REFERENCE.finditer(text):
        names += re.findall(DOTTED, match.group(1))
    return names


def resolve(name: str) -> object:
    """``django_idempotency.<name>``: the longest importable module, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module("django_idempotency." + ".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(name)


def test_every_comment_names_code() -> None:
    """Each ``code:`` comment names at least one attribute (a typo such as ``code: db``
    would otherwise name nothing and pass)."""
    text = MODEL.read_text(encoding="utf-8")
    assert text.count("code:") == len(REFERENCE.findall(text))
    assert len(set(references())) >= 40


@pytest.mark.parametrize("name", sorted(set(references())))
def test_model_step_names_real_code(name: str) -> None:
    try:
        resolve(name)
    except (AttributeError, ModuleNotFoundError) as exc:
        pytest.fail(f"model/protocol.pml names {name}, which does not exist: {exc}")


def test_make_model_checks_every_strategy() -> None:
    """``make model`` (model/configurations) covers the four strategies, and CI runs it."""
    configurations = (ROOT / "model" / "configurations").read_text(encoding="utf-8")
    strategies = set(re.findall(r"-DSTRATEGY=(\d)", configurations))
    assert strategies == {"1", "2", "3", "4"}
    assert "step model make model" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
