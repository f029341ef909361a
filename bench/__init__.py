"""Benchmarks: switchml-emu against gloo ring allreduce and a parameter server.

Benchmarks never run as timed asserts in tests; results are ratios measured side
by side in one invocation.
"""
