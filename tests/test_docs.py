"""The docs stay honest: every event type, setting and CLI command is documented."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

from workbench.cli import build_parser
from workbench.host import load_plugins, settings_classes
from workbench.log import EVENT_TYPES
from workbench.server.app import Workbench


def config_classes() -> list[type]:
    """Every settings class of the core and the loaded plugins, and the server extension's traitlets."""
    return [*settings_classes(load_plugins()), Workbench]

DOCS = Path(__file__).resolve().parent.parent / "docs"
PKG = Path(__file__).resolve().parent.parent / "workbench"


def headings(doc: str) -> set[str]:
    return set(re.findall(r"^###\s+`([^`]+)`", (DOCS / doc).read_text(), re.M))


def all_event_types() -> set[str]:
    """The core's event types and those of the built-in and installed plugins."""
    return set(EVENT_TYPES) | {t for p in load_plugins() for t in p.event_types()}


def test_the_readmes_install_gives_the_hands_pandas_matplotlib_and_pyarrow():
    """The hands run on the server's environment, offline: what the README's own example needs (load data,
    plot it, a DataFrame sent with --with as Parquet) must come with the install the README names."""
    import tomllib

    root = DOCS.parent
    install = re.search(r"pip install (-e )?\.(\[[\w,-]+\])?(?=\s)", (root / "README.md").read_text())
    assert install, "the README names no `pip install .` command"
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    extras = (install.group(2) or "[]").strip("[]").split(",")
    wanted = project["dependencies"] + [d for e in extras if e for d in project["optional-dependencies"][e]]
    names = {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].lower() for d in wanted}
    assert {"pandas", "matplotlib", "pyarrow"} <= names, f"`{install.group(0)}` installs {sorted(names)}"


def test_every_event_type_is_documented_and_every_documented_type_exists():
    documented = headings("events.md")
    assert all_event_types() - documented == set(), "event types missing from docs/events.md"
    assert documented - all_event_types() == set(), "docs/events.md documents types that do not exist"


def test_every_event_type_used_in_the_code_is_known():
    """String literals passed as an event type anywhere in the package are in EVENT_TYPES."""
    call = re.compile(r"""\b(?:append|aappend|_append|_emit|on_event|sink|emit)\(\s*(?:[\w.\[\]"']+,\s*)?["']([a-z_]+)["']""")
    used = set()
    for path in PKG.rglob("*.py"):
        used |= set(call.findall(path.read_text()))
    assert used, "the scan found no event types: the pattern is broken"
    assert used - all_event_types() == set()


def _fields(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return [name for name, trait in cls.class_own_traits(config=True).items()]


def test_every_setting_is_documented():
    text = (DOCS / "settings.md").read_text()
    missing = [f"{cls.__name__}.{name}" for cls in config_classes() for name in _fields(cls) if f"`{name}`" not in text]
    assert missing == []


def test_every_cli_command_is_documented():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    documented = {h.split()[-1] for h in headings("cli.md")}
    assert set(sub.choices) - documented == set(), "commands missing from docs/cli.md"
    assert documented - set(sub.choices) == set(), "docs/cli.md documents commands that do not exist"


def test_every_websocket_message_kind_is_documented():
    """Each `{"kind": ...}` the session stream sends is described in docs/api.md, and each described one is sent."""
    sent = set(re.findall(r'"kind":\s*"(\w+)"', (PKG / "server" / "fanout.py").read_text()))  # where they are made
    assert {"event", "delta", "output"} <= sent, "the scan found no message kinds: the pattern is broken"
    api = (DOCS / "api.md").read_text()
    stream = api[api.index("### websocket"):api.index("### `POST /workbench/api/sessions/{id}/interrupt`")]
    documented = set(re.findall(r'\{"kind":\s*"(\w+)"', stream))
    assert sent - documented == set(), "websocket message kinds missing from docs/api.md"
    assert documented - sent == set(), "docs/api.md documents websocket message kinds the server does not send"
