"""pytest with NORM_CONFIGS patched from $NORM_JSON."""
# ruff: noqa: I001  (an archived copy of a scratch/next65 script: `scratch` is first-party only in the tree it ran from)
import sys

import pytest

import scratch.next65.patch  # noqa: F401

sys.exit(pytest.main(sys.argv[1:]))
