from gpuflight.cli import console

console()
