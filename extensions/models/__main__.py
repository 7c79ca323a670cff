"""``python -m extensions.models fetch NAME | path NAME | adopt NAME FILE | list`` (see ``extensions/models/cli.py``)."""
import sys

from .cli import main

sys.exit(main())
