"""`python -m bench`: see bench/README.md."""

import sys

from .run import main

sys.exit(main())
