import sys

from prefillbench.cli import main

sys.exit(main())
