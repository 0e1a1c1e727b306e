"""``python -m tcdsl``: the command line (see ``tcdsl.cli``)."""

import sys

from .cli import main

sys.exit(main())
