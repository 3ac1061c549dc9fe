"""``python -m sam3track``: the ``sam3track`` command."""

import sys

from sam3track.cli import main

sys.exit(main())
