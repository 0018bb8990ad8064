"""`python -m speedmatrix.cli`: the same as the `speedmatrix` command."""

import sys

from speedmatrix.cli import main

sys.exit(main())
