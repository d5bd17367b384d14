"""The one service every face calls, over two transports (docs/architecture.md, "One service, two transports").

    Workbench   the interface: one async method per operation (base.py)
    Local       in-process, over a Host (local.py): the server's handlers, the CLI on the database file
    Rest        over a server's REST API and websocket (rest.py): the notebook client, the CLI beside a server
    Blocking    the same from synchronous code: the service on a loop in a thread of its own (blocking.py)
"""

from .base import Message, Watch, Workbench, event_of
from .blocking import Blocking
from .parts import RestCalls, ServicePart

__all__ = ["Blocking", "Message", "RestCalls", "ServicePart", "Watch", "Workbench", "event_of"]
