"""``python -m gemm_ladder``: see :mod:`gemm_ladder.cli`."""

import sys

from .cli import main

sys.exit(main())
