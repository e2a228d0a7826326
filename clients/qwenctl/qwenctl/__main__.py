"""``python -m qwenctl``."""

import sys

from qwenctl.cli import main

sys.exit(main())
