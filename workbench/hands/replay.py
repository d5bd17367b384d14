"""Replay: after a kernel death, the calls the model marked replayable are re-run in the fresh kernel."""

from __future__ import annotations

from typing import Any


async def replay(calls: list[dict[str, Any]], run: Any, emit: Any, generation: int, timeout: float) -> list[str]:
    """Re-run replayable calls in a fresh kernel, stopping at the first failure; notes for the model."""
    if not calls:
        return []
    ran, failed = [], None
    for call in calls:
        obs = await run(call["code"], timeout)
        if not obs.ok:
            failed = call
            break
        ran.append(call)
    await emit("hands_replayed", {"generation": generation, "calls": [c["tool_use_id"] for c in ran],
                                  "ok": failed is None, "failed": failed["tool_use_id"] if failed else None})
    lines = "\n".join(f"- {(c['code'].strip().splitlines() or ['(empty)'])[0][:100]}" for c in ran)
    notes = [f"[the kernel was fresh, so {len(ran)} earlier call(s) marked replayable were re-run first:\n{lines}]"]
    if failed:
        notes.append(f"[replay stopped: call {failed['tool_use_id']} failed when re-run; later ones were not re-run]")
    return notes
