"""Looking at the switch.

Snapshots to gRPC and back (the stats service and its client), Prometheus
text, the rich TUI, pcap writing and reading, the capture decoder, the
optional scapy layer. These work on snapshot dicts and capture files; the
server (``swemu.serving``) hosts them, so they sit below it.

May import: swemu.protocol, swemu.core.
"""
