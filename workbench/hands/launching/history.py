"""IPython's history in a session's own file: `.ipython_history.sqlite` in its workspace.

IPython keeps the code of every cell (`In`, `%history`, `%recall`, `%rerun`, `_i3`) in a sqlite
file; a notebook's kernel keeps it under the user's home, shared by every kernel of that user. The
hands start kernels with the history in memory (a pooled kernel serves no session yet, and no
session's code may reach another's or the user's home), and once a kernel serves a session it moves
its history to the session's workspace: the calls of every kernel the session had are there
(`%history -g`, `%history ~1/`), as in a notebook after a restart, and no other session's are.
The file counts against the workspace's quota like any other.
"""

from __future__ import annotations

HISTORY_FILE = ".ipython_history.sqlite"

CODE = '''
def _workbench_history():
    import os

    from IPython import get_ipython
    from IPython.core.history import HistoryManager

    ip = get_ipython()
    old = ip.history_manager
    path = os.path.join(os.getcwd(), {name!r})
    if str(old.hist_file) == path:
        return
    new = HistoryManager(shell=ip, parent=ip, hist_file=path)
    old.end_session()
    old._stop_save_thread()
    ip.history_manager = new
    ip.configurables = [c for c in ip.configurables if c is not old] + [new]
    # the user's names for the history are the manager's lists: they follow it
    names = {{"_ih": new.input_hist_parsed, "In": new.input_hist_parsed, "_oh": new.output_hist,
              "Out": new.output_hist, "_dh": new.dir_hist}}
    ip.user_ns.update(names)
    ip.user_ns_hidden.update(names)


_workbench_history()
del _workbench_history
'''


def history_code() -> str:
    """The code a kernel runs once it serves a session, in the session's working directory: its history file."""
    return CODE.format(name=HISTORY_FILE)
