"""``python -m latentstruct.show_trees``: an alias of ``python -m latentstruct.report.trees`` (old commands)."""

import sys

from latentstruct.report.trees import main

if __name__ == "__main__":
    sys.exit(main())
