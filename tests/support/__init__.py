"""Helpers shared by the tests: fixtures, services, workloads' drivers. Test modules import
from here, never from each other."""
