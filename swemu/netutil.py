"""Small socket helpers shared by the emulator and the host library (no protocol state)."""

from __future__ import annotations

import contextlib
import socket

BUFFER_BYTES = 16 << 20


def set_socket_buffers(sock: socket.socket, size: int = BUFFER_BYTES) -> None:
    """Ask for large send/receive buffers: bursts of a whole window must not
    overflow them. Root may exceed ``net.core.rmem_max`` with the FORCE options."""
    for force, plain in (
        (getattr(socket, "SO_RCVBUFFORCE", None), socket.SO_RCVBUF),
        (getattr(socket, "SO_SNDBUFFORCE", None), socket.SO_SNDBUF),
    ):
        done = False
        if force is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, force, size)
                done = True
        if not done:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, plain, size)


def parse_address(text: str, default_port: int) -> tuple[str, int]:
    """``HOST[:PORT]`` -> (host, port); IPv6 literals in brackets."""
    text = text.strip()
    if not text:
        raise ValueError("empty address")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, ""
    if not port:
        return host, default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad port in address {text!r}")
    return host, int(port)


def resolve_ipv4(host: str) -> str:
    """The IPv4 address of ``host`` (SwitchML runs over IPv4)."""
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]
    except socket.gaierror as exc:
        raise OSError(f"cannot resolve {host!r} to an IPv4 address: {exc.strerror}") from None
