#!/usr/bin/env bash
# Take the screenshots of the docs again, from the browser tests that make them (a real JupyterLab in
# headless Chromium), and copy them into docs/: the README's picture and the gallery of docs/jupyterlab.md.
# Needs what scripts/test.sh installs (.venv, chromium). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf test-artifacts/ui
.venv/bin/python -m pytest -q -p no:cacheprovider "$@" \
  tests/ui/test_browser.py::test_sidebar_session_chat_hands_memories \
  tests/ui/test_chat_render.py tests/ui/test_data_review.py tests/ui/test_layout.py tests/ui/test_notebook_context.py \
  tests/ui/test_eval_report.py
from=test-artifacts/ui
to=docs/screenshots
cp "$from/5-review-panel.png" docs/screenshot.png
while read -r shot name; do
  cp "$from/$shot.png" "$to/$name.png"
done <<'LIST'
13-sidebar sidebar
10-rendered-reply rendered-reply
11-notebook-cell notebook-cell
15-agent-cell agent-cell
12-stop-after-rejected-send stop
14-dark dark
16-open-as-notebook open-as-notebook
17-highlighted-code highlighted-code
review-panel-light review-panel-light
review-panel-dark review-panel-dark
review-panel-readable review-panel-readable
data-notebook-attach notebook-attach
data-notebook-load notebook-load
data-sidebar-files sidebar-files
layout-sidebar-light sidebar-default-width
layout-sidebar-dark sidebar-default-width-dark
layout-chat-tab-light chat-tab
layout-chat-tab-dark chat-tab-dark
context-ask-selection context-ask-selection
context-fix-error context-fix-error
evals-report-light eval-report
evals-report-dark eval-report-dark
evals-sidebar-running evals-sidebar
LIST
echo "docs/screenshot.png and $to/ taken again from $from/"
