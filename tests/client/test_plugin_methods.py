"""The notebook client's plugin methods (Plugin.client()): wb.eval, wb.memories, ... found by name, refused on a clash."""

from __future__ import annotations

import pytest

from workbench.client.api import WorkbenchClient, plugin_methods
from workbench.errors import PluginError
from workbench.plugins import Plugin


class Adds(Plugin):
    def __init__(self, name: str, methods: dict) -> None:
        super().__init__(name=name)
        self.methods = methods

    def client(self):
        return self.methods


def shout(client, text: str) -> str:
    """Say it louder."""
    return text.upper() + f" ({client.url})"


def test_the_built_in_plugins_methods_are_the_clients():
    c = WorkbenchClient("http://127.0.0.1:9")  # nothing listens: no method here calls the server
    try:
        names = dir(c)
        for name in ("eval", "eval_runs", "eval_results", "eval_report", "eval_export", "memories", "review", "recall", "dream",
                     "dreams", "dream_status", "cancel_dream", "import_memories", "export_memories", "memory"):
            assert name in names, name
        assert c.eval.__doc__.startswith("Run every task")
        assert c.memories.__name__ == "memories"
        with pytest.raises(AttributeError, match="no plugin adds one"):
            c.no_such_method  # noqa: B018
        with pytest.raises(AttributeError):
            c._private  # noqa: B018
    finally:
        c.close()


def test_a_plugins_method_gets_the_client_first():
    methods = plugin_methods([Adds("loud", {"shout": shout})])
    c = WorkbenchClient("http://127.0.0.1:9")
    try:
        c.__dict__["_plugin_methods"] = methods  # this client's plugins: only the one above
        assert c.shout("hi") == "HI (http://127.0.0.1:9)" and c.shout.__doc__ == "Say it louder."
    finally:
        c.close()


@pytest.mark.parametrize("plugins, words", [
    ([Adds("a", {"call": shout})], "adds the client method 'call', which the client has already"),
    ([Adds("a", {"sessions": shout})], "adds the client method 'sessions', which the client has already"),
    ([Adds("a", {"_secret": shout})], "adds the client method '_secret'"),
    ([Adds("a", {"shout": shout}), Adds("b", {"shout": shout})], "plugins 'a' and 'b' both add the client method 'shout'"),
])
def test_a_clash_is_refused_naming_both(plugins, words):
    with pytest.raises(PluginError, match=words.replace("(", r"\(").replace(")", r"\)")):
        plugin_methods(plugins)


def test_importing_the_client_loads_no_plugin_and_no_brain():
    """The plugins (and the brain's parts they import) load at the first plugin method, not at `import`."""
    import subprocess
    import sys

    code = "import sys, workbench.client.api; print(sorted(m for m in sys.modules if m.startswith(" \
           "('workbench.brain', 'workbench.plugins', 'workbench.memory', 'workbench.evals'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout
