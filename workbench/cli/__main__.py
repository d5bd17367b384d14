"""`python -m workbench.cli` is the `workbench` command."""

import sys

from .main import main

sys.exit(main())
