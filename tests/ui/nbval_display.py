"""A pytest plugin for the nbval run: apply `update_display_data` to the display it updates.

nbval 0.11 ignores `update_display_data`, so a cell that shows a live view and updates it as
it goes (the `%%agent` magic does) would be compared by its first frame, while JupyterLab and
nbclient (which wrote the reference outputs) keep the last. This holds each display that has a
display_id back until its cell is idle, then hands it to nbval with its latest content.
"""

from __future__ import annotations

from typing import Any

from nbval.kernel import RunningKernel

_get_message = RunningKernel.get_message


def _display_id(msg: dict[str, Any]) -> str | None:
    return (msg["content"].get("transient") or {}).get("display_id")


def get_message(self: RunningKernel, stream: str, timeout: float | None = None) -> dict[str, Any]:
    """RunningKernel.get_message, with display updates applied before nbval sees the display."""
    if stream != "iopub":
        return _get_message(self, stream, timeout=timeout)
    held: list[dict[str, Any]] = self.__dict__.setdefault("_held_displays", [])
    ready: list[dict[str, Any]] = self.__dict__.setdefault("_ready_messages", [])
    while not ready:
        msg = _get_message(self, stream, timeout=timeout)
        kind = msg["msg_type"]
        if kind == "display_data" and _display_id(msg):
            held.append(msg)
        elif kind == "update_display_data":
            for shown in held:
                if _display_id(shown) == _display_id(msg):
                    shown["content"]["data"] = msg["content"]["data"]
                    shown["content"]["metadata"] = msg["content"]["metadata"]
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            parent = msg["parent_header"].get("msg_id")
            mine = [m for m in held if m["parent_header"].get("msg_id") == parent]
            held[:] = [m for m in held if m not in mine]
            ready.extend([*mine, msg])
        else:
            ready.append(msg)
    return ready.pop(0)


RunningKernel.get_message = get_message
