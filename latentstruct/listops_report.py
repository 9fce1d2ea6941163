"""``python -m latentstruct.listops_report``: an alias of ``python -m latentstruct.report.listops`` (old commands)."""

import sys

from latentstruct.report.listops import main

if __name__ == "__main__":
    sys.exit(main())
