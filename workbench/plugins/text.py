"""Text for plugins: an event as a person reads it, a call's result as text (or as the content blocks the model read),
tables, one-line cuts, and Markdown as safe HTML."""

from __future__ import annotations

from ..markdown import markdown_html
from ..render import event_text, one_line, parts, result_blocks, result_text, table

__all__ = ["event_text", "markdown_html", "one_line", "parts", "result_blocks", "result_text", "table"]
