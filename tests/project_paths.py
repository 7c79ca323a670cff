"""Where the project and the shared test data are, for tests in any folder under tests/.

Test files sit in subfolders (tests/verify/, tests/training/, ...) while the fixtures and the support
modules stay in tests/: paths computed from a test file's own location would change with its folder,
these do not.
"""
from __future__ import annotations

from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = TESTS_DIR.parent
FIXTURES_DIR = TESTS_DIR / "fixtures"
