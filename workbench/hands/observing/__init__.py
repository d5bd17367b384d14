"""Observing: a call's outputs as a notebook and the model see them, within a budget.

One way in and one way out. A `Collector` takes the kernel messages of one call (telling a live
watcher each piece as it comes, live.py) and folds them as JupyterLab's output area does
(fold.py), every part checked and bounded by the call's `Budget` (clean.py, images.py), into an
`Observation`: the record, stored. What the model reads of it is rendered from that record
(render.py: text and image blocks within `output_limit` characters and `max_images` images), so
the record is enough to read it again, the same, at any later time.

Floors, from the ground: clean and images; fold and live; render; widgets; observation; collect. Nothing here
imports another part of the hands: observing is the hands' ground floor (tests/test_structure.py).
"""

from .collect import TIMED_OUT, Budget, Collector, Notebook, death_note, setup_code, stuck_note
from .hints import missing_module
from .live import OutputSink
from .observation import Observation, failure, result_content

__all__ = ["TIMED_OUT", "Budget", "Collector", "Notebook", "Observation", "OutputSink", "death_note", "failure", "missing_module",
           "result_content", "setup_code", "stuck_note"]
