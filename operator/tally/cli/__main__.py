"""``python -m tally.cli``: the same as the ``kubectl-tally`` console script."""

import sys

from tally.cli.main import main

sys.exit(main())
