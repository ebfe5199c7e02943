"""gpuflight's face: the command line, the local stack and the demos.

The only package that imports both halves: `producer` (the per-node capture library) and
`streams` (the stream app). Neither imports this package.
"""
