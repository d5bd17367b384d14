"""The notebook side: a client of the server's API, the %agent magics and the live chat view.

It talks to the workbench server over HTTP and a websocket and never opens the
DuckDB file. `workbench.connect()` and `%load_ext workbench` are the entry points.
"""

from .api import Answer, Stream, WorkbenchClient, connect, find_server

__all__ = ["Answer", "Stream", "WorkbenchClient", "connect", "find_server"]
