"""Entry point of ``python -m extensions.verify`` (see ``extensions/verify/cli.py``)."""
import sys

from .cli import main

sys.exit(main())
