import sys

from gpuflight.cli import main

sys.exit(main())
