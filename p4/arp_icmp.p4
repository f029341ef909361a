/*
 * arp_icmp.p4 -- answer ARP requests for, and pings to, the switch's IPv4
 * address, so that workers using the kernel's UDP stack can reach it (the
 * kernel resolves the switch's MAC address with ARP before it sends a
 * datagram, and ping is how people check the path).
 *
 * The control plane installs the switch's address (section 5: the IPv4 and
 * MAC that UdpSession returns) as entries of arp_icmp. Replies go back out of
 * the port the request came in on and skip egress. Everything else that is
 * not SwitchML is dropped: this program is an aggregator, not a router.
 */

#ifndef _ARP_ICMP_P4_
#define _ARP_ICMP_P4_

#include "configuration.p4"
#include "types.p4"
#include "headers.p4"

control ArpIcmpResponder(
    inout header_t hdr,
    in ingress_intrinsic_metadata_t ig_intr_md,
    inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
    inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {

    action send_back() {
        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port;
        ig_tm_md.bypass_egress = 1;
    }

    // "Who has switch_ip?" -> "switch_ip is at switch_mac".
    action reply_arp(mac_addr_t switch_mac) {
        hdr.ethernet.dst_addr = hdr.arp.sender_hw_addr;
        hdr.ethernet.src_addr = switch_mac;
        hdr.arp.opcode = ARP_OPCODE_REPLY;
        hdr.arp.target_hw_addr = hdr.arp.sender_hw_addr;
        ipv4_addr_t switch_ip = hdr.arp.target_proto_addr;
        hdr.arp.target_proto_addr = hdr.arp.sender_proto_addr;
        hdr.arp.sender_hw_addr = switch_mac;
        hdr.arp.sender_proto_addr = switch_ip;
        send_back();
    }

    // Echo request -> echo reply: swap the addresses, change the type. The
    // IPv4 checksum does not change (same fields, swapped); the ICMP checksum
    // is fixed in apply below.
    action reply_icmp_echo(mac_addr_t switch_mac) {
        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = switch_mac;
        ipv4_addr_t switch_ip = hdr.ipv4.dst_addr;
        hdr.ipv4.dst_addr = hdr.ipv4.src_addr;
        hdr.ipv4.src_addr = switch_ip;
        hdr.icmp.msg_type = ICMP_ECHO_REPLY;
        send_back();
    }

    action drop() {
        ig_dprsr_md.drop_ctl = 1;
    }

    // Entries, per switch address (ip, mac):
    //   (true, ARP_OPCODE_REQUEST, ip, false, _, _)        : reply_arp(mac)
    //   (false, _, _, true, ICMP_ECHO_REQUEST, ip)         : reply_icmp_echo(mac)
    table arp_icmp {
        key = {
            hdr.arp.isValid() : exact;
            hdr.arp.opcode : ternary;
            hdr.arp.target_proto_addr : ternary;
            hdr.icmp.isValid() : exact;
            hdr.icmp.msg_type : ternary;
            hdr.ipv4.dst_addr : ternary;
        }
        actions = {
            reply_arp;
            reply_icmp_echo;
            @defaultonly drop;
        }
        const default_action = drop();
        size = 16;
    }

    apply {
        switch (arp_icmp.apply().action_run) {
            reply_icmp_echo: {
                // Incremental checksum update (RFC 1624): the type byte went
                // from 8 to 0, so the ones'-complement checksum grows by
                // 0x0800, with the end-around carry when that overflows.
                if (hdr.icmp.checksum[15:11] == 0x1F) {
                    hdr.icmp.checksum = hdr.icmp.checksum + 0x0801;
                } else {
                    hdr.icmp.checksum = hdr.icmp.checksum + 0x0800;
                }
            }
        }
    }
}

#endif /* _ARP_ICMP_P4_ */
