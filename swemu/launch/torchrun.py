"""The environment torchrun gives each rank, for launchers that start ranks themselves
(``switchml run -- CMD``, the overlap benchmark)."""

from __future__ import annotations

import os
import socket


def torchrun_envs(workers: int) -> list[dict[str, str]]:
    """What torchrun sets for each rank of a one-machine job, one dict per
    rank: the world, the rank, a rendezvous on a free loopback port (rank 0's
    ``init_process_group`` serves the store there) and one OpenMP thread per
    process unless the user chose otherwise."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        "WORLD_SIZE": str(workers),
        "LOCAL_WORLD_SIZE": str(workers),
        "ROLE_WORLD_SIZE": str(workers),
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "ROLE_NAME": "default",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = "1"
    return [
        {**env, "RANK": str(r), "LOCAL_RANK": str(r), "ROLE_RANK": str(r)} for r in range(workers)
    ]
