"""Hands for plugins: the hands protocol, the one way files go in and out of a workspace, and a check run in
fresh hands over a frozen copy of another session's workspace (`python_verdict`)."""

from __future__ import annotations

from ..hands import Hands, discard_kept_workspace
from ..hands.files import FileRefused, NoWorkspace, check_path, copy_tree, list_files, read_files, write_file
from ..hands.verdict import Verdict, clip, listing, python_verdict, score_of

__all__ = ["FileRefused", "Hands", "NoWorkspace", "Verdict", "check_path", "clip", "copy_tree",
           "discard_kept_workspace", "list_files", "listing",
           "python_verdict", "read_files", "score_of", "write_file"]
