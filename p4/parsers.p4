/*
 * parsers.p4 -- ingress and egress parsers and deparsers.
 *
 * Ingress sees two kinds of SwitchML packets:
 *   - a worker's packet (Ethernet / IPv4 / UDP to 0xBEE0..0xBEEF / SwitchML),
 *   - a later pass of one (passes.p4): the same packet, recirculated through
 *     this pipe's recirculation port with a switchml_md header in front. Its
 *     headers are the ones this program wrote, so their layout is fixed; what
 *     follows them depends on the pass: 64 values to aggregate (the harvest
 *     pass of size code 1, the consume passes of size code 3) or the result
 *     values collected so far (collect passes), which stay payload.
 * Egress only sees results, always behind a switchml_md header.
 */

#ifndef _PARSERS_P4_
#define _PARSERS_P4_

#include "configuration.p4"
#include "headers.p4"

parser IngressParser(
    packet_in pkt,
    out header_t hdr,
    out ingress_metadata_t ig_md,
    out ingress_intrinsic_metadata_t ig_intr_md) {

    state start {
        pkt.extract(ig_intr_md);
        pkt.advance(PORT_METADATA_SIZE);

        // Metadata that is read before any control writes it starts at 0.
        ig_md.pass_type = PASS_FIRST;
        ig_md.value_op = 0;
        ig_md.drop = 0;
        ig_md.action_code = ACTION_AGGREGATED;
        ig_md.job_id = 0;
        ig_md.worker_bitmap_before = 0;
        ig_md.map_result = 0;
        ig_md.count = 0;

        transition select(ig_intr_md.ingress_port[6:0]) {
            RECIRCULATION_PORT_IN_PIPE : parse_switchml_md;
            default : parse_ethernet;
        }
    }

    state parse_switchml_md {
        pkt.extract(hdr.switchml_md);
        ig_md.pass_type = hdr.switchml_md.pass_type;
#ifdef P4TESTGEN
        // For P4Testgen only (p4/testgen/generate.py): the recirculation port
        // carries nothing but what a pass of this program sends (next_step.p4,
        // passes.p4): a later pass; a consume pass says write, add or read, any
        // other pass carries a result; multicast only with a result; the
        // sender on a port of this pipe other than P4Testgen's drop port 511.
        testgen_assume(hdr.switchml_md.pass_type >= PASS_HARVEST
            && hdr.switchml_md.pass_type <= PASS_COLLECT_0_FIRST
            && (hdr.switchml_md.result == 1 || hdr.switchml_md.multicast == 0)
            && ((hdr.switchml_md.pass_type >= PASS_CONSUME1
                    && hdr.switchml_md.pass_type <= PASS_CONSUME3
                    && hdr.switchml_md.value_op != 0)
                || ((hdr.switchml_md.pass_type < PASS_CONSUME1
                        || hdr.switchml_md.pass_type > PASS_CONSUME3)
                    && hdr.switchml_md.result == 1))
            && hdr.switchml_md.ingress_port[8:7] == ig_intr_md.ingress_port[8:7]
            && hdr.switchml_md.ingress_port != 511);
#endif
        transition select(hdr.switchml_md.pass_type) {
            PASS_HARVEST : parse_later_pass_values;
            PASS_CONSUME1 : parse_later_pass_values;
            PASS_CONSUME2 : parse_later_pass_values;
            PASS_CONSUME3 : parse_later_pass_values;
            default : parse_later_pass_headers;   // collect passes
        }
    }

    state parse_later_pass_values {
        pkt.extract(hdr.ethernet);
        pkt.extract(hdr.ipv4);
        pkt.extract(hdr.udp);
        pkt.extract(hdr.switchml);
        transition parse_values;
    }

    state parse_later_pass_headers {
        pkt.extract(hdr.ethernet);
        pkt.extract(hdr.ipv4);
        pkt.extract(hdr.udp);
        pkt.extract(hdr.switchml);
        transition accept;
    }

    state parse_ethernet {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4 : parse_ipv4;
            ETHERTYPE_ARP : parse_arp;
            default : accept;
        }
    }

    state parse_arp {
        pkt.extract(hdr.arp);
        transition accept;
    }

    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        // Unfragmented packets without options only: a fragment of a SwitchML
        // datagram is not a SwitchML packet (the flags' low bit is MF).
        transition select(hdr.ipv4.ihl, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.protocol) {
            (5, 3w0 &&& 3w1, 0, IP_PROTOCOL_UDP) : parse_udp;
            (5, 3w0 &&& 3w1, 0, IP_PROTOCOL_ICMP) : parse_icmp;
            default : accept;
        }
    }

    state parse_icmp {
        pkt.extract(hdr.icmp);
        transition accept;
    }

    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dst_port) {
            SWITCHML_UDP_PORT_BASE &&& SWITCHML_UDP_PORT_MASK : parse_switchml;
            default : accept;
        }
    }

    state parse_switchml {
        pkt.extract(hdr.switchml);
        // The values are extracted for the size codes this program aggregates
        // only (size code 3: the first 64 of them; the rest stays payload for
        // the consume passes); every other code is dropped by CheckPacket,
        // which needs the header alone. A datagram too short for 64 values
        // ends the parse with an error, which CheckPacket counts as malformed.
        transition select(hdr.switchml.size) {
            SIZE_CODE_ONE_PASS : parse_values;
            SIZE_CODE_FOUR_PASSES : parse_values;
            default : accept;
        }
    }

    state parse_values {
        pkt.extract(hdr.values_first);
        pkt.extract(hdr.values_second);
        transition accept;
    }
}

control IngressDeparser(
    packet_out pkt,
    inout header_t hdr,
    in ingress_metadata_t ig_md,
    in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {

    apply {
        pkt.emit(hdr.switchml_md);
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.arp);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.icmp);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.switchml);
        pkt.emit(hdr.values_first);
        pkt.emit(hdr.values_second);
    }
}

parser EgressParser(
    packet_in pkt,
    out header_t hdr,
    out egress_metadata_t eg_md,
    out egress_intrinsic_metadata_t eg_intr_md) {

    // Only results reach egress (ARP and ICMP replies and later passes
    // bypass it), so the layout is fixed. The SwitchML header and values stay
    // payload: egress rewrites addresses only.
    state start {
        pkt.extract(eg_intr_md);
        pkt.extract(hdr.switchml_md);
        pkt.extract(hdr.ethernet);
        pkt.extract(hdr.ipv4);
        pkt.extract(hdr.udp);
        transition accept;
    }
}

control EgressDeparser(
    packet_out pkt,
    inout header_t hdr,
    in egress_metadata_t eg_md,
    in egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {

    Checksum() ipv4_checksum;

    apply {
        // The source and destination addresses changed: recompute the IPv4
        // header checksum. (The UDP checksum is set to 0, "none", in egress.)
        hdr.ipv4.hdr_checksum = ipv4_checksum.update({
            hdr.ipv4.version,
            hdr.ipv4.ihl,
            hdr.ipv4.diffserv,
            hdr.ipv4.total_len,
            hdr.ipv4.identification,
            hdr.ipv4.flags,
            hdr.ipv4.frag_offset,
            hdr.ipv4.ttl,
            hdr.ipv4.protocol,
            hdr.ipv4.src_addr,
            hdr.ipv4.dst_addr
        });
        // switchml_md is not emitted: it never leaves the switch.
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.udp);
    }
}

#endif /* _PARSERS_P4_ */
