/*
 * result.p4 -- send a result (docs/protocol.md section 2, "A result packet").
 *
 * A result is sent from the switch's address and the UDP port the triggering
 * packet was sent to:
 *   - multicast: to every registered worker of the job. Each job has a
 *     multicast group (mgid) with one node per worker, whose replication id
 *     (rid) the control plane chooses unique across jobs (job_id << 5 |
 *     worker id). Egress looks the rid up to get the worker's MAC, IPv4 and
 *     UDP port; a worker registered with udp_port 0 gets the source port of
 *     the triggering packet. The sender gets its copy too (no pruning).
 *   - unicast: back to the retransmitting worker only, out of the port it
 *     came in on, with source and destination swapped.
 * Ingress hands the result to the traffic manager at the end of its last pass
 * (passes.p4, NextPass); this file is the egress side.
 */

#ifndef _RESULT_P4_
#define _RESULT_P4_

#include "configuration.p4"
#include "types.p4"
#include "headers.p4"

// Egress: the packet still carries the triggering packet's worker -> switch
// addresses; turn them into switch -> worker ones.
control RewriteResult(
    inout header_t hdr,
    in egress_intrinsic_metadata_t eg_intr_md,
    inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {

    action from_switch_to(in mac_addr_t mac, in ipv4_addr_t ip) {
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ethernet.dst_addr = mac;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.ipv4.dst_addr = ip;
    }

    // A worker registered with its UDP port.
    action to_worker(mac_addr_t mac, ipv4_addr_t ip, udp_port_t udp_port) {
        from_switch_to(mac, ip);
        hdr.udp.src_port = hdr.udp.dst_port;
        hdr.udp.dst_port = udp_port;
    }

    // A worker registered by IP alone (udp_port 0): to the source port of the
    // triggering packet.
    action to_worker_by_ip(mac_addr_t mac, ipv4_addr_t ip) {
        from_switch_to(mac, ip);
        udp_port_t switch_port = hdr.udp.dst_port;
        hdr.udp.dst_port = hdr.udp.src_port;
        hdr.udp.src_port = switch_port;
    }

    // A replication id nobody registered (a rank that left): send nothing.
    action no_worker() {
        eg_dprsr_md.drop_ctl = 1;
    }

    action to_sender() {
        mac_addr_t switch_mac = hdr.ethernet.dst_addr;
        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = switch_mac;
        ipv4_addr_t switch_ip = hdr.ipv4.dst_addr;
        hdr.ipv4.dst_addr = hdr.ipv4.src_addr;
        hdr.ipv4.src_addr = switch_ip;
        udp_port_t switch_port = hdr.udp.dst_port;
        hdr.udp.dst_port = hdr.udp.src_port;
        hdr.udp.src_port = switch_port;
    }

    table worker_address {
        key = {
            eg_intr_md.egress_rid : exact;
        }
        actions = {
            to_worker;
            to_worker_by_ip;
            @defaultonly no_worker;
        }
        const default_action = no_worker();
        size = MAX_WORKER_ENTRIES;
    }

    apply {
        if (hdr.switchml_md.multicast == 1) {
            worker_address.apply();
        } else {
            to_sender();
        }
        // UDP over IPv4 may go without a checksum; the payload changed.
        hdr.udp.checksum = 0;
    }
}

#endif /* _RESULT_P4_ */
