"""``python -m latentstruct.figures``: an alias of ``python -m latentstruct.report.figures`` (old commands)."""

import sys

from latentstruct.report.figures import main

if __name__ == "__main__":
    sys.exit(main())
