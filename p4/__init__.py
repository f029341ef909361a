"""The mirror P4 program's directory; ``p4.controller`` is its hardware control plane.

Not part of the wheel: import it with the repository on the path.

May import: swemu.protocol, swemu.core, swemu.serving (the controller's dry run
serves the emulator's data plane).
"""
