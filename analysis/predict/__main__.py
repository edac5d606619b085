"""`python -m analysis.predict`: the command line of `analysis.predict.cli`."""

import sys

from analysis.predict.cli import main

sys.exit(main())
