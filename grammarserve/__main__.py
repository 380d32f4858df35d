"""``python -m grammarserve``: the same command line as the ``grammarserve`` script."""

import sys

from grammarserve.cli import main

sys.exit(main())
