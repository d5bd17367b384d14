"""An Inspect AI task whose bash and python tools run in workbench hands (`sandbox="workbench"`), offline.

The model is Inspect's `mockllm/model` with scripted outputs that call the tools: bash writes a file in the
sample's workspace, python kills its own kernel (the hands replace it and the call says so), python runs again
in the fresh kernel, then the model answers. The scorer reads the file back through the sandbox. Each sample's
calls are in a workbench log as a session of kind `inspect` (`workbench sessions --db DB`).

    python examples/inspect/workbench_task.py --db run.duckdb --log-dir logs
    inspect view --log-dir logs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inspect_ai import Task, eval, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, scorer
from inspect_ai.solver import TaskState, generate, use_tools
from inspect_ai.tool import bash, python
from inspect_ai.util import sandbox

STEPS = (
    ("bash", {"command": "pwd && echo \"hello from $(whoami)\" > note.txt && cat note.txt"}),
    ("python", {"code": "import os, signal\nprint('about to die', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)"}),
    ("python", {"code": "import os\nprint('alive again in', os.getcwd(), 'pid', os.getpid())\nprint(open('note.txt').read())"}),
)


def outputs() -> list[ModelOutput]:
    """What the mock model says: a tool call per step, then its answer."""
    outs = [*(ModelOutput.for_tool_call("mockllm/model", name, args, tool_call_id=f"call-{i}")
              for i, (name, args) in enumerate(STEPS, 1)),
            ModelOutput.from_content("mockllm/model", "The note says hello.")]
    for out in outs:  # usage given, so that the mock model counts no tokens (its tokenizer would be downloaded)
        out.usage = ModelUsage(input_tokens=10, output_tokens=10, total_tokens=20)
    return outs


@scorer(metrics=[])
def note_written():
    async def score(state: TaskState, target: Target) -> Score:
        note = await sandbox().read_file("note.txt")
        return Score(value=CORRECT if target.text in note else INCORRECT, answer=note.strip())

    return score


@task
def workbench_hands(db: str = "", backend: str = "sandbox") -> Task:
    config = {k: v for k, v in {"db": db, "backend": backend}.items() if v}
    return Task(dataset=[Sample(input="Write a note in your workspace, then read it back.", target="hello from")],
                solver=[use_tools(bash(timeout=120), python(timeout=120)), generate()],
                scorer=note_written(), sandbox=("workbench", config), message_limit=20)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default="", help="the workbench log file of the samples' sessions")
    p.add_argument("--backend", default="sandbox", choices=("sandbox", "local"), help="how the kernels run")
    p.add_argument("--log-dir", default="logs", help="where Inspect writes its log")
    args = p.parse_args(argv)
    (log,) = eval(workbench_hands(db=args.db, backend=args.backend), model=get_model("mockllm/model", custom_outputs=outputs()),
                  log_dir=args.log_dir, display="none")
    print(Path(log.location).resolve())
    return 0 if log.status == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
