"""``python -m models.server``: see ``models.server.cli``."""

import sys

from models.server.cli import main

if __name__ == "__main__":
    sys.exit(main())
