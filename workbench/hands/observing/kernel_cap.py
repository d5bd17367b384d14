"""An output budget installed *inside* a kernel, so floods never leave it.

Capping only on the receiving side would still ship a gigabyte print over
ZMQ into the server's memory. The hands send this file's source to each new
kernel (a silent execute, so it works for every backend, gateways included)
and call `install(limit)`: sys.stdout and sys.stderr then send at most
`limit` characters per execution and per stream *as a person sees them*
(carriage returns and backspaces applied, as `terminal_write` does; counted
since the last `clear_output`), so a progress bar that rewrites one line
ten thousand times costs one line; and at most `RAW_FACTOR * limit`
characters as written. Of what comes after, the kernel keeps only the last
`limit - limit // 2` characters as a person sees them, and publishes how
much it held back, with that tail, as a display of MIME type DROPPED_MIME
where it was written (before the next display, result or error, or at the
end of the execution). The hands fold it into the stream in its place (the
final state of a long run matters most) and into their truncation note.
Writes below the Python level (a C library or a subprocess writing to
fd 1) are counted here too: ipykernel sends fds 1 and 2 through a pipe
that a thread of its own reads and writes to sys.stdout or sys.stderr.
That thread can be behind when a call's code ends, so at the end of each
call the kernel writes DRAIN_MARK to each fd and waits until the thread has
passed it on (everything written before it has then been read into the
call's stream); the mark itself is taken out. Without that wait, what a
subprocess or a C library wrote last was sent after the call was over,
and shown in no call.
"""

DROPPED_MIME = "application/vnd.workbench.dropped+json"
RAW_FACTOR = 64  # raw characters a call may send per stream, in `limit`s: a progress bar's overwrites cost no room
DRAIN_MARK = "\x00workbench-drained\x00"  # written to fds 1 and 2 at a call's end; never shown
DRAIN_WAIT = 2.0  # seconds to wait for the thread that reads fds 1 and 2 to pass the mark on


def terminal_write(line, col, text):
    """`text` written on `line` with the cursor at `col`, as a terminal (and JupyterLab) shows it: a carriage
    return goes back to the line's start and what follows overwrites, a backspace deletes the character before
    the cursor. Returns the lines it completed (each with its newline), the line now written, and the cursor's
    column in it, so that the next write, in this message or the next, goes on where this one left off."""
    done = []
    for i, part in enumerate(text.split("\n")):
        if i:
            done.append(line + "\n")
            line, col = "", 0
        if col == len(line) and "\r" not in part and "\x08" not in part:
            line += part
            col = len(line)
            continue
        for k, run in enumerate(part.split("\r")):
            if k:
                col = 0
            for j, piece in enumerate(run.split("\x08")):
                if j and col:
                    line, col = line[:col - 1] + line[col:], col - 1
                if piece:
                    line, col = line[:col] + piece + line[col + len(piece):], col + len(piece)
    return "".join(done), line, col


def install(limit):
    """Cap sys.stdout and sys.stderr at `limit` characters per execution."""
    import sys

    from IPython import get_ipython

    ip = get_ipython()
    if hasattr(ip, "_tee"):
        # IPython (9+) wraps each cell's stream writes to keep every chunk in its output
        # history, in memory and then in its sqlite file: a flood would pile up there
        # even though we drop it. The workbench's log is the history; turn this one off.
        import contextlib

        ip._tee = lambda channel: contextlib.nullcontext()
    room_after = limit - limit // 2
    raw_cap = RAW_FACTOR * limit
    write_on = terminal_write  # by this name: the source's own names are deleted from the user's namespace
    streams: dict = {}  # name: what a person sees of it since the last clear_output, and what was held back

    def reset():
        for name in ("stdout", "stderr"):
            # done: characters of the lines it completed; line and col: the line being written, its cursor;
            # raw: characters sent. Once over the limit: after, characters of the lines completed since, the last
            # of which are kept in tail; cut, characters of a line too long to keep; whole, whether the tail starts
            # at the start of a line the hands hold `held` characters of; dirty, whether anything came since
            streams[name] = {"done": 0, "line": "", "col": 0, "raw": 0, "over": False, "after": 0, "tail": [],
                             "cut": 0, "whole": True, "held": 0, "dirty": False}

    def capped(name, write):
        def capped_write(s):
            if drains[name] is not None:  # a call's end is waiting for the mark to come through this stream
                s = unmarked(name, s)
                if not s:
                    return 0
            m = streams[name]
            if not m["over"]:
                if len(s) <= raw_cap - m["raw"]:
                    done, line, col = write_on(m["line"], m["col"], s)
                    if m["done"] + len(done) + len(line) <= limit:
                        m["raw"] += len(s)
                        m["done"] += len(done)
                        m["line"], m["col"] = line, col
                        return write(s)
                m.update(over=True, whole=True, held=len(m["line"]))
                room = min(limit - m["done"] - len(m["line"]), raw_cap - m["raw"])
                if room > 0 and m["col"] == len(m["line"]) and "\r" not in s[:room] and "\x08" not in s[:room]:
                    write(s[:room])  # appended text: what fits still goes, and the tail starts after it
                    m.update(raw=m["raw"] + room, done=m["done"] + room, line="", col=0, whole=False, held=0)
                    s = s[room:]
            m["dirty"] = True
            if len(s) > 4 * limit:  # a flood in one write: only its end can be shown
                m["cut"] += len(m["line"]) + len(s) - 2 * limit
                m.update(line="", col=0, tail=[], whole=False)
                s = s[-2 * limit:]
            done, line, col = write_on(m["line"], m["col"], s)
            m["done"] += len(done)
            m["after"] += len(done)
            tail = m["tail"]
            if done:
                tail.append(done[-room_after:])
            n = sum(len(t) for t in tail)
            while len(tail) > 1 and n - len(tail[0]) >= room_after:
                n -= len(tail.pop(0))
            if len(tail) > 64:  # many small writes: join them
                tail[:] = ["".join(tail)[-room_after:]]
            if len(line) > 2 * room_after:  # a line longer than can be shown: only its end is kept
                k = len(line) - room_after
                line, col = line[k:], max(0, col - k)
                m["cut"] += k
            m["line"], m["col"] = line, col
            return len(s)

        return capped_write

    mark, wait = DRAIN_MARK, DRAIN_WAIT  # by these names: the source's own names are deleted from the user's namespace
    drains: dict = {"stdout": None, "stderr": None}  # per stream while a drain waits: [event, held back prefix]
    armed: list = []  # non-empty from a cell's start (its streams wrapped) to its end's drain

    def unmarked(name, s):
        """`s` without the drain's mark, which sets the waiting event; a part of the mark at the end is held back
        until the next write (the thread reads the pipe in chunks, so the mark may come in two)."""
        drain = drains[name]
        s = drain[1] + s
        drain[1] = ""
        if mark in s:
            s = s.replace(mark, "", 1)
            drains[name] = None
            drain[0].set()
            return s
        for k in range(len(mark) - 1, 0, -1):
            if s.endswith(mark[:k]):
                drain[1] = s[-k:]
                return s[:-k]
        return s

    def drain(*args):
        """Wait until ipykernel's thread has read all that was written to fds 1 and 2 (by a subprocess, a C library)
        into sys.stdout and sys.stderr: a mark is written after it and waited for. Only through the pipe the
        kernel set up: if the code pointed fd 1 somewhere else (a file), nothing is written there."""
        import os
        import stat
        import threading

        if not armed:  # the cell that installed this: its streams were not wrapped, the mark would be shown
            return
        armed.clear()
        waiting = []
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            thread, fid = getattr(stream, "watch_fd_thread", None), getattr(stream, "_fid", None)
            fd = getattr(stream, "_original_stdstream_fd", None)
            if thread is None or fid is None or fd is None or not thread.is_alive():
                continue
            try:
                there, ours = os.fstat(fd), os.fstat(fid)
            except OSError:
                continue
            if not stat.S_ISFIFO(there.st_mode) or there.st_ino != ours.st_ino:
                continue
            done = threading.Event()
            drains[name] = [done, ""]
            try:
                os.write(fd, mark.encode())
            except OSError:
                drains[name] = None
                continue
            waiting.append((name, done))
        for name, done in waiting:  # both streams' threads at once
            if not done.wait(wait):
                drains[name] = None  # the thread is stuck, or the stream no longer goes through us: go on

    def wrap():
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if not getattr(stream.write, "_workbench_capped", False):
                stream.write = capped(name, stream.write)
                stream.write._workbench_capped = True

    def pre(*args):
        # wrap here, in each cell, not at install: the cell that installs this is itself
        # wrapped by IPython, which puts the stream's write back when that cell ends
        wrap()
        reset()
        armed[:] = [True]

    pub = ip.display_pub
    publish, clear = pub.publish, pub.clear_output

    def report(*args):
        """Send what was held back since the limit (how much, and its end as a person sees it) where it was written:
        before the next display, result or error, or at the call's end."""
        counts, tails = {}, {}
        for name, m in streams.items():
            if not m["dirty"]:
                continue
            getattr(sys, name).flush()
            line, col = m["line"][-room_after:], m["col"] - max(0, len(m["line"]) - room_after)
            kept = "".join(m["tail"])[-(room_after - len(line)):] if len(line) < room_after else ""
            cut = m["after"] - len(kept) + m["cut"] + len(m["line"]) - len(line)
            counts[name] = max(0, cut - m["held"])
            # from the start of the line the hands hold in part (a carriage return) when all of it is here; the
            # cursor is put back where it is, so that the next write goes on from there
            tails[name] = ("\r" if m["whole"] and not cut else "") + kept + line + (
                "\r" + line[:col] if 0 <= col < len(line) else "")
            # the hands hold this line now
            m.update(after=0, tail=[], cut=0, whole=True, held=len(m["line"]), dirty=False)
        if tails:
            publish(data={DROPPED_MIME: {**counts, "tail": tails}}, metadata={})

    def before(show):
        def shown(*args, **kw):
            report()
            return show(*args, **kw)

        return shown

    def clear_output(*args, **kw):
        # what was shown is gone, so the budget starts again: a progress loop keeps its last frame
        for name in ("stdout", "stderr"):
            getattr(sys, name).flush()
        reset()
        return clear(*args, **kw)

    reset()
    pub.publish = before(publish)
    ip.displayhook.start_displayhook = before(ip.displayhook.start_displayhook)
    if hasattr(ip, "_showtraceback"):  # ipykernel's: it sends the error message
        ip._showtraceback = before(ip._showtraceback)
    pub.clear_output = clear_output
    ip.events.register("pre_execute", pre)
    ip.events.register("post_execute", drain)
    ip.events.register("post_execute", report)
