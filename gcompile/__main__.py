"""`python -m gcompile ...` is the `gcompile` command."""
import sys

from .cli import main

sys.exit(main())
