"""IPython's history in a workbench kernel: a file of the session's own, written in the kernel's own thread.

The hands send this file's source to each kernel once it serves a session (as kernel_pip.py) and call
`install(path)`: `path` is the history file in the session's state directory, beside its workspace and never in
it (launching/state.py), or `:memory:` where the session has none (a gateway's kernels). Every kernel of the
session writes there, so `%history -g` and `%history ~1/` read what its earlier kernels ran, and no other
session's code. IPython's own manager saves a file from a thread of its own, which counts against the kernel's
process limit (and cannot start at it); this one writes each input as it is stored, before its cell runs (a cell
that kills the kernel is in the history too), in the thread that runs the cell.
"""


def install(path):
    """Make `path` this kernel's IPython history (`:memory:`: the kernel's memory only)."""
    import sys

    try:
        import sqlite3
    except ImportError:  # a Python built without it: IPython keeps no history at all
        return
    from pathlib import Path

    from IPython import get_ipython
    from IPython.core.history import HistoryManager

    class SessionHistory(HistoryManager):
        """IPython's history in `path`, each input written as it is stored: no saving thread."""

        def __init__(self, **kw):
            super().__init__(hist_file=":memory:", **kw)  # in memory, IPython starts no saving thread
            if path != ":memory:":
                self.db.close()
                self.hist_file = Path(path)
                self.opened(self.init_db, self.new_session)

        def init_db(self):
            super().init_db()
            if str(self.hist_file) != ":memory:":
                # a write-ahead log, not synced at each commit: a cell's input costs about half a millisecond more
                # than in memory (with a rollback journal made and deleted at each commit, five), and it still
                # outlives a killed kernel
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=NORMAL")

        def store_inputs(self, line_num, source, source_raw=None):
            super().store_inputs(line_num, source, source_raw)
            self.opened(self.writeout_cache)

        def opened(self, *steps):
            """Run `steps` on the file; if it cannot be written, say so once and keep the history in memory."""
            try:
                for step in steps:
                    step()
            except sqlite3.Error as e:
                print(f"[IPython's history could not be written to {self.hist_file} ({e}); this kernel keeps it "
                      "in memory]", file=sys.stderr)
                self.db.close()
                self.hist_file = ":memory:"
                self.init_db()
                self.new_session()

    ip = get_ipython()
    old = ip.history_manager
    if path == ":memory:" and str(old.hist_file) == path:
        return  # as the kernel was started: nothing is written anywhere
    new = SessionHistory(shell=ip, parent=ip)
    old.end_session()
    old._stop_save_thread()
    old.db.close()
    ip.history_manager = new
    ip.configurables = [c for c in ip.configurables if c is not old] + [new]
    # the user's names for the history are the manager's lists: they follow it
    names = {"_ih": new.input_hist_parsed, "In": new.input_hist_parsed, "_oh": new.output_hist,
             "Out": new.output_hist, "_dh": new.dir_hist}
    ip.user_ns.update(names)
    ip.user_ns_hidden.update(names)
