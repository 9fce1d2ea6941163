"""``python -m latentstruct.tables``: an alias of ``python -m latentstruct.report.tables`` (old commands)."""

import sys

from latentstruct.report.tables import main

if __name__ == "__main__":
    sys.exit(main())
