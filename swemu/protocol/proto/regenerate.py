"""Regenerate the committed gRPC stubs from the .proto files in this folder."""

from __future__ import annotations

import pathlib
import re
import sys


def main() -> int:
    from grpc_tools import protoc  # dev extra only

    here = pathlib.Path(__file__).parent
    for proto in sorted(here.glob("*.proto")):
        rc = protoc.main(
            [
                "protoc",
                f"-I{here}",
                f"--python_out={here}",
                f"--pyi_out={here}",
                f"--grpc_python_out={here}",
                str(proto),
            ]
        )
        if rc:
            return rc
        stub = here / f"{proto.stem}_pb2_grpc.py"
        # protoc writes absolute imports; the stubs live inside a package.
        stub.write_text(
            re.sub(r"^import (\w+_pb2) as", r"from . import \1 as", stub.read_text(), flags=re.M)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
