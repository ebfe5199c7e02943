"""`python -m gpuflight` runs the `gpuflight` command (gpuflight/cli.py)."""

from gpuflight.cli import console

console()
