"""Runs pytest on the given paths; a suite with no tests yet (pytest's exit status 5) passes, saying so."""

import sys

import pytest

if __name__ == "__main__":
    status = pytest.main(sys.argv[1:])
    if status == pytest.ExitCode.NO_TESTS_COLLECTED:
        print(f"no tests collected in {sys.argv[1:]}: this package has no tests yet")
        status = 0
    sys.exit(status)
