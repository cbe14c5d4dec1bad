"""The Promela models of the protocol (model/protocol.pml) and of a request in steps
(model/steps.pml), checked by ``make model``, name the code each of their steps stands for,
in comments ``code: module.attribute, ...`` relative to the package: every name must exist,
so that renaming or removing a step of the protocol shows up as a change of a model too.
Spin itself runs in ``make model``, not here."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODELS = (ROOT / "model" / "protocol.pml", ROOT / "model" / "steps.pml")

DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+"
#: ``code:`` then dotted names separated by commas, a list that may go on over the comment's
#: next lines (`` * `` continues them).
REFERENCE = re.compile(rf"code:\s*(?:\*\s*)?({DOTTED}(?:,\s*(?:\*\s*)?{DOTTED})*)")


def references(model: Path) -> list[str]:
    text = model.read_text(encoding="utf-8")
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


@pytest.mark.parametrize(
    ("model", "least"), [(MODELS[0], 40), (MODELS[1], 20)], ids=["protocol", "steps"]
)
def test_every_comment_names_code(model: Path, least: int) -> None:
    """Each ``code:`` comment names at least one attribute (a typo such as ``code: db``
    would otherwise name nothing and pass)."""
    text = model.read_text(encoding="utf-8")
    assert text.count("code:") == len(REFERENCE.findall(text))
    assert len(set(references(model))) >= least


@pytest.mark.parametrize(
    ("model", "name"),
    sorted({(model.name, name) for model in MODELS for name in references(model)}),
)
def test_model_step_names_real_code(model: str, name: str) -> None:
    try:
        resolve(name)
    except (AttributeError, ModuleNotFoundError) as exc:
        pytest.fail(f"model/{model} names {name}, which does not exist: {exc}")


def test_make_model_checks_every_strategy() -> None:
    """``make model`` (model/configurations) covers the four strategies, and CI runs it."""
    configurations = (ROOT / "model" / "configurations").read_text(encoding="utf-8")
    strategies = set(re.findall(r"-DSTRATEGY=(\d)", configurations))
    assert strategies == {"1", "2", "3", "4"}
    # The model of a request in steps, under both strategies that run steps, and its
    # counterexamples of code that would be wrong.
    steps = re.findall(r"^(\S+)\s+steps\.pml\s+(.*)$", configurations, re.MULTILINE)
    assert {flags.split()[0] for name, flags in steps if not name.startswith("bug-")} == {
        "-DSTRATEGY=1",
        "-DSTRATEGY=2",
    }
    assert len([name for name, _ in steps if name.startswith("bug-")]) == 8
    assert any("-DPURGE" in flags for name, flags in steps if not name.startswith("bug-"))
    assert any("-DLIFETIME" in flags for name, flags in steps if not name.startswith("bug-"))
    assert "step model make model" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
