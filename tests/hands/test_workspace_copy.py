"""The workspace module's walk over a whole tree (copy_tree, list_files) and its reads for a child (read_files),
with what an agent may leave in a workspace: links, FIFOs, huge or deep trees, names that are not UTF-8.
(The same under a daemon that swaps names while they are copied: tests/hands/test_swap.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from workbench.hands.files import MAX_DEPTH, FileRefused, copy_tree, list_files, read_files


@pytest.fixture
def src(tmp_path):
    root = tmp_path / "src"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("a")
    (root / "sub" / "b.txt").write_text("b")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o700)
    (root / "big.bin").write_bytes(b"x" * 5000)
    os.mkfifo(root / "pipe")
    (tmp_path / "outside.txt").write_text("secret")
    os.symlink(tmp_path / "outside.txt", root / "link")
    os.symlink(tmp_path, root / "dirlink")
    os.mkdir(os.fsencode(root) + b"/caf\xe9")  # names that are not UTF-8
    os.symlink(b"/etc", os.fsencode(root) + b"/l\xff")
    (root / ".wb-upload-0123456789abcdef").write_text("half an upload")
    return root


def test_a_copy_holds_files_and_directories_and_leaves_out_links_fifos_and_what_passes_the_limit(src, tmp_path):
    dst = tmp_path / "dst"
    notes = copy_tree(src, dst, limit_bytes=1000, max_entries=100)
    assert (dst / "a.txt").read_text() == "a" and (dst / "sub" / "b.txt").read_text() == "b"
    assert os.stat(dst / "run.sh").st_mode & 0o777 == 0o755 and os.stat(dst / "a.txt").st_mode & 0o777 == 0o644
    assert os.path.isdir(os.fsencode(dst) + b"/caf\xe9")
    assert sorted(os.listdir(dst)) == ["a.txt", "caf\udce9", "run.sh", "sub"]  # no link, FIFO, big file or upload
    assert set(notes) == {"big.bin: left out (the copy would pass 1,000 bytes)", "dirlink: left out (a symbolic link)",
                             "l\ufffd: left out (a symbolic link)", "link: left out (a symbolic link)",
                             "pipe: left out (not a regular file)"}  # text the log takes: no lone surrogate


def test_a_copy_is_for_its_owner(src, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only root gives files away")
    dst = tmp_path / "dst"
    copy_tree(src, dst, limit_bytes=1 << 20, max_entries=100, owner=(64999, 64998))
    for top, dirs, files in os.walk(dst):
        for name in ["", *dirs, *files]:
            st = os.lstat(os.path.join(top, name))
            assert (st.st_uid, st.st_gid) == (64999, 64998)


def test_a_walk_stops_at_its_entries_and_depth_and_says_so(tmp_path):
    wide, deep = tmp_path / "wide", tmp_path / "deep"
    wide.mkdir()
    for i in range(50):
        (wide / f"f{i:02}").write_text(str(i))
    notes = copy_tree(wide, tmp_path / "wide-copy", limit_bytes=1 << 20, max_entries=10)
    assert len(os.listdir(tmp_path / "wide-copy")) == 10 and notes == ["./: this and later entries are left out (at most 10 are walked)"]
    listed, cut = list_files(wide, 10)
    assert len(listed) == 10 and cut
    path = deep
    for _ in range(MAX_DEPTH + 5):
        path = path / "d"
    path.mkdir(parents=True)
    (path / "bottom.txt").write_text("deep")
    notes = copy_tree(deep, tmp_path / "deep-copy", limit_bytes=1 << 20, max_entries=1000)
    assert len(notes) == 1 and f"more than {MAX_DEPTH} levels deep" in notes[0]
    assert not list((tmp_path / "deep-copy").rglob("bottom.txt"))


def test_a_listing_names_links_and_others_without_following_them(src):
    listed, cut = list_files(src, 100)
    kinds = {f["path"]: f["type"] for f in listed}
    assert kinds == {"a.txt": "file", "big.bin": "file", "caf\ufffd": "dir", "dirlink": "link", "l\ufffd": "link",
                     "link": "link", "pipe": "other", "run.sh": "file", "sub": "dir", "sub/b.txt": "file"}
    assert not cut and next(f for f in listed if f["path"] == "big.bin")["bytes"] == 5000


@pytest.mark.parametrize("paths, refused", [
    (["link"], "cannot read 'link'"), (["dirlink/outside.txt"], "cannot read 'dirlink/outside.txt'"),
    (["pipe"], "not a regular file"), (["nope"], "has no 'nope'"), (["a.txt", "big.bin"], "10 bytes in all"),
])
def test_files_for_a_child_are_read_without_following_links_and_within_their_limit(src, paths, refused):
    assert read_files(src, ["a.txt", "sub/b.txt"], 10) == {"a.txt": b"a", "sub/b.txt": b"b"}
    with pytest.raises(FileRefused, match=refused) as e:
        read_files(src, paths, 10)
    assert "secret" not in str(e.value)


def as_nobody(fn, where: Path):
    """fn() in the directory `where`, as an unprivileged uid: as root, in a forked child that drops to nobody (root
    reads any file); it starts in `where`, so the directories above need not be open to nobody (the caller
    restores its working directory: monkeypatch.chdir)."""
    os.chdir(where)
    if os.geteuid() != 0:
        return fn()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            os.write(w, json.dumps(fn()).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    os.waitpid(pid, 0)
    return json.loads(out)


def test_an_entry_the_copy_cannot_open_is_left_out_with_a_note(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # restored after the test
    tmp_path.chmod(0o777)
    src = tmp_path / "src"
    (src / "shut").mkdir(parents=True)
    (src / "ok.txt").write_text("ok")
    (src / "locked.txt").write_text("x")
    src.chmod(0o755)
    (src / "ok.txt").chmod(0o644)
    (src / "locked.txt").chmod(0)
    (src / "shut").chmod(0)
    notes = as_nobody(lambda: copy_tree(Path("src"), Path("dst"), limit_bytes=1000, max_entries=100), tmp_path)
    assert sorted(notes) == ["locked.txt: left out (Permission denied)", "shut: left out (Permission denied)"]
    assert (tmp_path / "dst" / "ok.txt").read_text() == "ok"
    (src / "shut").chmod(0o755)  # for pytest's clean-up
