"""Regenerate the committed gRPC stubs from the .proto files in this folder."""

from __future__ import annotations

import pathlib
import re
import sys

#: The stubs check at import that the installed grpcio is at least the grpcio-tools
#: that wrote them; they are written to need no more than pyproject.toml asks for.
GRPCIO_FLOOR = "1.85.1"


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
        # a .proto importing another: its message module imports the other's
        pb2 = here / f"{proto.stem}_pb2.py"
        pb2.write_text(
            re.sub(r"^import (\w+_pb2) as", r"from . import \1 as", pb2.read_text(), flags=re.M)
        )
        stub = here / f"{proto.stem}_pb2_grpc.py"
        # protoc writes absolute imports; the stubs live inside a package.
        text = re.sub(r"^import (\w+_pb2) as", r"from . import \1 as", stub.read_text(), flags=re.M)
        text = re.sub(
            r"^GRPC_GENERATED_VERSION = '[^']*'",
            f"GRPC_GENERATED_VERSION = '{GRPCIO_FLOOR}'",
            text,
            flags=re.M,
        )
        stub.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
