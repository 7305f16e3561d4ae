"""`python -m reftrain` (what torchrun and `reftrain --nproc` start on every rank)."""

import sys

from reftrain.cli import main

sys.exit(main())
