"""`python -m hpcring` is the `hpcring` command."""

import sys

from hpcring.cli import main

sys.exit(main())
