/*
 * headers.p4 -- the headers a packet may carry, in wire order, and the
 * protocol numbers the parsers select on.
 */

#ifndef _HEADERS_P4_
#define _HEADERS_P4_

#include "types.p4"

const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<16> ETHERTYPE_ARP = 0x0806;
const bit<8>  IP_PROTOCOL_ICMP = 1;
const bit<8>  IP_PROTOCOL_UDP = 17;
const bit<16> ARP_OPCODE_REQUEST = 1;
const bit<16> ARP_OPCODE_REPLY = 2;
const bit<8>  ICMP_ECHO_REQUEST = 8;
const bit<8>  ICMP_ECHO_REPLY = 0;

struct header_t {
    switchml_md_h     switchml_md;  // internal: later passes and egress only
    ethernet_h        ethernet;
    arp_h             arp;
    ipv4_h            ipv4;
    icmp_h            icmp;
    udp_h             udp;
    switchml_h        switchml;
    value_half_h      values_first;   // values 0..31 of the pass
    value_half_h      values_second;  // values 32..63 of the pass
}

#endif /* _HEADERS_P4_ */
