"""``python -m tulip_rose_cli``: the same as the ``tulip-rose`` command."""

import sys

from tulip_rose_cli.cli import main

sys.exit(main())
