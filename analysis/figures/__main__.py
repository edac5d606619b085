"""``python -m analysis.figures``: see ``analysis.figures``."""

import sys

from analysis.figures import main

sys.exit(main())
