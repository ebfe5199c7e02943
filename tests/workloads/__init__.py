"""Test workloads in C (capture, dlopen), their builder and their oracle."""
