"""P4Testgen's tests of switchml.p4, replayed against the emulator's switch engine.

p4c's P4Testgen executes the P4 program symbolically with its Tofino (TNA) semantics and
writes PTF tests: table entries, starting register values, an input packet on a port and
the expected output packet (with don't-care masks) or a drop. :mod:`p4.testgen.ptf` reads
them into :class:`~p4.testgen.ptf.TestCase` records, :mod:`p4.testgen.generate` runs the
generator and writes the committed corpus (``corpus/``), and :mod:`p4.testgen.replay`
maps each test into a :class:`swemu.core.engine.SwitchEngine` and compares what the
emulator does with what the program does. p4/README.md, "P4Testgen", says what the
replay covers and what it cannot.

May import: swemu.protocol, swemu.core (the engine replayed against).
"""
