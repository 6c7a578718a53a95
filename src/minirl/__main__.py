"""``python -m minirl``: the ``minirl`` command line."""

import sys

from minirl.cli import main

sys.exit(main())
