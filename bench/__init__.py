"""Benchmarks: switchml-emu against gloo ring allreduce and a parameter server.

Benchmarks never run as timed asserts in tests; results are ratios measured side
by side in one invocation.

May import: swemu, hostlib, p4: everything but cli (a command is run by its
command line, e.g. ``python -m cli.worker``). Nothing imports bench.
"""
