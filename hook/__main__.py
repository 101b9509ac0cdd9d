"""``python -m hook``: the same entry as the console script."""

import sys

from hook.entry import main

sys.exit(main())
