"""`python -m kjit.bench`: kjit/bench/benchmark.py's command line (--help says what it runs)."""

import sys

try:
    import torch  # noqa: F401 -- looked for first: a message, not a traceback, without it
except ImportError:
    sys.exit("python -m kjit.bench needs PyTorch: pip install torch")

from kjit.bench.benchmark import main

sys.exit(main())
