"""`python -m optimum_amdx` is `optimum-amdx`."""

import sys

from .cli.main import main

sys.exit(main())
