"""``python -m gemm_ladder.barriers``: see :mod:`gemm_ladder.barriers.ladder`."""

import sys

from .ladder import main

sys.exit(main())
