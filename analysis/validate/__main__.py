"""`python -m analysis.validate`: the command line of `analysis.validate.cli`."""

import sys

from analysis.validate.cli import main

sys.exit(main())
