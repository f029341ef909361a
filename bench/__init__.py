"""Benchmarks: switchml-emu against gloo ring allreduce and a parameter server.

Benchmarks never run as timed asserts in tests; results are ratios measured side
by side in one invocation.

May import: everything. Nothing imports bench but ``switchml simulate`` and
``switchml cluster``.
"""
