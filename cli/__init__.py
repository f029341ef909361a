"""Command-line tools: ``switchml-emu`` (the switch) and ``switchml`` (the workers).

One module per command, registered on the two root groups in :mod:`cli.main`;
heavy imports happen inside the commands so that ``--help`` is instant.
Argument parsing and terminal output only: the logic lives in the packages.

May import: swemu, hostlib (``simulate`` runs swemu.model, ``cluster`` swemu.rack);
nothing imports cli.
"""
