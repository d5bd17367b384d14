"""Every request limit (the MAX_* constants of the checks every face shares, of the server's and the plugins'
bodies, and of the websocket's live output) is in
docs/api.md's table with its value, and the table names no constant that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

from workbench import checks
from workbench.brain import live
from workbench.evals import routes as eval_routes
from workbench.memory import routes as memory_routes
from workbench.server import bodies

API_MD = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def constants() -> dict[str, int | float]:
    return {name: value for module in (checks, bodies, memory_routes, eval_routes, live) for name, value in vars(module).items()
            if name.startswith("MAX_") and isinstance(value, (int, float))}


def shown(value: int | float) -> set[str]:
    """The ways the table may write a value."""
    forms = {str(value), f"{value:,}"}
    if value == 2**53 - 1:
        forms.add("2^53-1")
    if value == 1e9:
        forms.add("1e9")
    return forms


def test_every_limit_is_in_the_table_with_its_value():
    text = API_MD.read_text()
    table = text[text.index("### Limits"):]
    rows = [line for line in table.splitlines() if line.startswith("|")]
    named = set(re.findall(r"`(MAX_\w+)`", table))
    missing, wrong = [], []
    for name, value in constants().items():
        mine = [r for r in rows if f"`{name}`" in r]
        if not mine:
            missing.append(name)
        elif not any(f in r for r in mine for f in shown(value)):
            wrong.append(f"{name} = {value}")
    assert missing == [], "limits missing from docs/api.md"
    assert wrong == [], "limits whose value docs/api.md does not show"
    assert named - set(constants()) == set(), "docs/api.md names limits that do not exist"
