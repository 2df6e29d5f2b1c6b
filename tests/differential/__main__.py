"""python -m differential PROPERTY [--profile P] [--max-examples N] [--device cuda|cpu]: one
property of the differential suite in this process (run from the tests/ folder)."""

import sys

from .runner import main

sys.exit(main())
