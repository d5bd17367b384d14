"""The error tree a plugin raises and catches (workbench/errors.py): each maps to one HTTP status and one
CLI exit code, so a plugin's routes and commands answer as the core's do."""

from __future__ import annotations

from ..errors import (
                      BodyTooLarge,
                      ConfigError,
                      DatabaseLocked,
                      MemoryConflict,
                      PluginError,
                      RequestRefused,
                      ServerUnavailable,
                      SharedStoreReadOnly,
                      TurnBusy,
                      UnknownMemory,
                      UnknownSession,
                      WorkbenchError,
)

__all__ = ["BodyTooLarge", "ConfigError", "DatabaseLocked", "MemoryConflict", "PluginError", "RequestRefused",
           "ServerUnavailable", "SharedStoreReadOnly", "TurnBusy", "UnknownMemory", "UnknownSession", "WorkbenchError"]
