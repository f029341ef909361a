"""Small socket helpers shared by the emulator and the host library (no protocol state)."""

from __future__ import annotations

import contextlib
import ctypes
import socket
import struct

BUFFER_BYTES = 16 << 20


# below this receive buffer (as getsockopt reports it) a busy emulator drops
# datagrams: measured with 4 workers x 64 MiB on loopback, the stock
# net.core.rmem_max (208 KiB, a 416 KiB buffer) cost ~1000 retransmissions and
# twice the time per call; 4 MiB (an 8 MiB buffer) none of that
SWITCH_BUFFER_BYTES = 4 << 20


def receive_buffer(sock: socket.socket) -> int:
    """The socket's receive buffer in bytes, as the kernel accounts it."""
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)


def buffer_advice(have: int, need: int, who: str) -> str | None:
    """A one-line warning when a receive buffer of ``have`` bytes is below
    ``need`` (None otherwise): what it costs and the sysctl that fixes it.
    Unprivileged processes cannot exceed ``net.core.rmem_max``."""
    if have >= need:
        return None
    return (
        f"{who}'s UDP receive buffer is {have >> 10} KiB, less than the {need >> 10} KiB "
        "it needs: bursts will be dropped and retransmitted (slow). Raise the limit with "
        f"`sudo sysctl -w net.core.rmem_max={BUFFER_BYTES} net.core.wmem_max={BUFFER_BYTES}` "
        "(or run as root)"
    )


def set_socket_buffers(sock: socket.socket, size: int = BUFFER_BYTES) -> None:
    """Ask for large send/receive buffers: bursts of a whole window must not
    overflow them. Root may exceed ``net.core.rmem_max`` with the FORCE options;
    others get at most that (see :func:`buffer_advice`)."""
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


def mac_of_ipv4(ip: str) -> int:
    """The MAC address (as an integer) of the local interface holding ``ip``, or 0
    if it cannot be found (not Linux, loopback, no permission). The switch's
    controller needs it to address results on real hardware."""
    import fcntl
    import os
    import struct

    siocgifaddr = 0x8915
    try:
        names = os.listdir("/sys/class/net")
    except OSError:
        return 0
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for name in names:
            try:
                req = struct.pack("256s", name.encode()[:15])
                addr = socket.inet_ntoa(fcntl.ioctl(probe.fileno(), siocgifaddr, req)[20:24])
            except OSError:
                continue
            if addr == ip:
                with open(f"/sys/class/net/{name}/address") as f:
                    return int(f.read().strip().replace(":", ""), 16)
    except (OSError, ValueError):
        return 0
    finally:
        probe.close()
    return 0


def interface_mac(host: str, advertise_ip: str | None = None) -> int:
    """The MAC a switch bound to ``host`` gives workers (UdpSessionResponse.mac):
    that of the interface holding ``host`` (or, for a wildcard host, holding
    ``advertise_ip``), else :data:`swemu.protocol.wire.DEFAULT_SWITCH_MAC` (wildcard or
    loopback addresses, whose interface has no MAC). A client that writes its own
    Ethernet headers (p4app-switchML's DPDK backend) sends to this MAC."""
    from swemu.protocol.wire import DEFAULT_SWITCH_MAC

    for ip in (host, advertise_ip):
        if ip and ip not in ("0.0.0.0", ""):
            mac = mac_of_ipv4(ip)
            if mac:
                return mac
    return DEFAULT_SWITCH_MAC


def parse_mac(text: str) -> int:
    """``aa:bb:cc:dd:ee:ff`` (or with ``-``) -> the MAC as an integer; ValueError otherwise."""
    parts = text.strip().replace("-", ":").split(":")
    if len(parts) != 6 or not all(len(p) in (1, 2) for p in parts):
        raise ValueError(f"{text!r} is not a MAC address (aa:bb:cc:dd:ee:ff)")
    try:
        return int("".join(p.zfill(2) for p in parts), 16)
    except ValueError:
        raise ValueError(f"{text!r} is not a MAC address (aa:bb:cc:dd:ee:ff)") from None


def format_mac(mac: int) -> str:
    """A MAC as ``aa:bb:cc:dd:ee:ff``."""
    return ":".join(f"{(mac >> s) & 0xFF:02x}" for s in range(40, -8, -8))


_SO_ATTACH_FILTER = 26  # asm-generic/socket.h


def hold_broadcast_port(used: set[int], tries: int = 64) -> tuple[socket.socket | None, int]:
    """A UDP port no other job of this engine uses, held for a job's broadcast
    results: a socket bound to it with ``SO_REUSEADDR`` (so the job's workers can
    bind it too, and no socket without that option can take it meanwhile) and a
    filter that drops whatever reaches it. ``(None, 0)`` if none can be had."""
    insn = ctypes.create_string_buffer(struct.pack("HBBI", 0x06, 0, 0, 0))  # BPF: ret #0
    prog = struct.pack("HL", 1, ctypes.addressof(insn))  # struct sock_fprog
    refused: list[socket.socket] = []  # kept open meanwhile, so the kernel picks others
    try:
        for _ in range(tries):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, prog)
                sock.bind(("0.0.0.0", 0))
            except OSError:
                sock.close()
                return None, 0
            port = sock.getsockname()[1]
            if port not in used:
                return sock, port
            refused.append(sock)
        return None, 0
    finally:
        for sock in refused:
            sock.close()
