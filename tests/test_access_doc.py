"""docs/infrastructure.md's table of each function's DynamoDB access says what
``stacks/access.py`` grants, row by row (a review found it seven rows stale)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stacks.access import TABLE_ACCESS

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parent.parent / "docs" / "infrastructure.md"
STREAM = "'s stream"  # the stream's actions are granted by the event source mapping's construct


def documented() -> dict[str, set[tuple[str, str]]]:
    """(table or index, action) pairs of each function's row, its parenthesised remarks left out."""
    rows: dict[str, set[tuple[str, str]]] = {}
    for line in DOC.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        names = re.findall(r"`([a-z_]+)`", cells[0]) if len(cells) == 3 and cells[0].startswith("`") else []
        if not names or cells[1] in ("DynamoDB", "---"):
            continue
        pairs = set()
        for group in re.sub(r"\([^)]*\)", "", cells[1]).split(";"):
            if ":" not in group or STREAM in group:
                continue
            target, actions = group.split(":", 1)
            pairs |= {(target.strip(), action.strip()) for action in actions.split(",") if action.strip()}
        for name in names:
            rows[name] = pairs
    return rows


def granted(function: str) -> set[tuple[str, str]]:
    pairs = set()
    for target, actions in TABLE_ACCESS[function].items():
        name = f"{target[0].name}/index/{target[1].name}" if isinstance(target, tuple) else target.name
        pairs |= {(name, action.removeprefix("dynamodb:").removesuffix("Item")) for action in actions}
    return pairs


@pytest.mark.parametrize("function", sorted(TABLE_ACCESS))
def test_the_documented_access_of_each_function_is_what_it_is_granted(function):
    rows = documented()
    assert function in rows, f"docs/infrastructure.md has no row for {function}"
    assert rows[function] == granted(function)
