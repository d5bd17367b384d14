"""Which plugins a host (or the notebook client) loads: the built-in ones, the installed ones (entry points of the
group `workbench.plugins`) and those the settings name, minus the disabled ones (docs/plugins.md)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import entry_points

from ..config import from_env
from ..errors import PluginError
from . import Plugin

# Built-in plugins load exactly like third-party ones: by dotted path (module:attribute).
BUILTIN_PLUGINS = (
    "workbench.memory.plugin:MemoryPlugin",
    "workbench.evals.plugin:EvalPlugin",
    "workbench.delegate.plugin:DelegatePlugin",
)
ENTRY_POINTS = "workbench.plugins"


@dataclass
class PluginSettings:
    """Which plugins load (env: WORKBENCH_<FIELD>; fields of HostSettings, documented in docs/settings.md)."""

    plugins: str = ""  # extra plugins to load, comma-separated module:attribute paths
    disable_plugins: str = ""  # names of plugins not to load, comma-separated (built-in or installed)


def _load(path: str) -> Plugin:
    module, _, attr = path.strip().partition(":")
    try:
        obj = getattr(importlib.import_module(module), attr) if attr else importlib.import_module(module)
    except (ImportError, AttributeError) as e:
        raise PluginError(f"cannot load plugin {path!r}: {e}") from None
    plugin = obj() if isinstance(obj, type) else obj
    if not isinstance(plugin, Plugin) or not plugin.name:
        raise PluginError(f"{path!r} is not a workbench plugin (a workbench.plugins.Plugin with a name)")
    return plugin


def load_plugins(settings: PluginSettings | None = None) -> list[Plugin]:
    """The built-in plugins, the installed ones (entry points) and those named in the settings, minus disabled ones."""
    s = settings or from_env(PluginSettings)
    paths = list(BUILTIN_PLUGINS)
    paths += [f"{ep.value}" for ep in entry_points(group=ENTRY_POINTS)]
    paths += [p for p in s.plugins.split(",") if p.strip()]
    disabled = {n.strip() for n in s.disable_plugins.split(",") if n.strip()}
    plugins: list[Plugin] = []
    for path in dict.fromkeys(p.strip() for p in paths):
        plugin = _load(path)
        if plugin.name in disabled:
            continue
        if any(p.name == plugin.name for p in plugins):
            raise PluginError(f"two plugins are called {plugin.name!r} ({path}); disable one with WORKBENCH_DISABLE_PLUGINS")
        plugins.append(plugin)
    return plugins
