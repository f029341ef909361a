/*
 * switchml.p4 -- SwitchML in-network aggregation for the Tofino Native
 * Architecture: the mirror of swemu (the emulator) for size codes 1 (64 int32
 * values per packet) and 3 (256, in four passes). docs/protocol.md sections 1-2 are
 * the contract; README.md beside this file maps every table and register to
 * its rule.
 *
 * Ingress, a worker's packet (PASS_FIRST):
 *   WorkerLookup        who sent it (unknown source -> counted drop)
 *   CheckPacket         malformed / wrong size code (counted drops)
 *   RejectSlot          slot index >= P (counted drop)
 *   PoolAddress         where its (slot, set) lives
 *   UpdateWorkerBitmap  section 2 steps 1-2: bitmap, retransmission
 *   CountWorkers        step 3: workers still missing
 *   Exponents           step 4: e0/e1 signed maxima
 *   Aggregate           step 4: write / add / nothing, 32 register pairs
 *   NextStep            step 5: multicast / unicast / nothing, and the later
 *                       passes it takes (recirculation)
 * Ingress, a later pass of a packet (passes.p4):
 *   Exponents, Aggregate  size code 1: read e1 and the second value halves;
 *                         size code 3: aggregate the next quarter, or
 *                         collect a result 32 values at a time
 *   NextPass              round once more, or send the result (multicast
 *                         group or the sender's port)
 * Egress:
 *   RewriteResult       switch -> worker addresses per replication id
 * Anything else: ArpIcmpResponder (ARP and ping for the switch's address).
 *
 * Compile with p4/build.sh (bf-p4c, Tofino 1); check-p4 (p4c's p4test front
 * end) accepts it. See README.md.
 */

#include <core.p4>
#include <tna.p4>

#include "configuration.p4"
#include "types.p4"
#include "headers.p4"
#include "parsers.p4"
#include "worker_lookup.p4"
#include "checks.p4"
#include "bitmap.p4"
#include "count.p4"
#include "exponents.p4"
#include "aggregate.p4"
#include "next_step.p4"
#include "passes.p4"
#include "result.p4"
#include "counters.p4"
#include "arp_icmp.p4"

control Ingress(
    inout header_t hdr,
    inout ingress_metadata_t ig_md,
    in ingress_intrinsic_metadata_t ig_intr_md,
    in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
    inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
    inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {

    WorkerLookup() worker_lookup;
    CheckPacket() check_packet;
    RejectSlot() reject_slot;
    SlotOffset() slot_offset;
    PoolAddress() pool_address;
    UpdateWorkerBitmap() worker_bitmap;
    CountWorkers() count_workers;
    Exponents() exponents;
    Aggregate() aggregate;
    NextStep() next_step;
    NextPass() next_pass;
    CountActions() count_actions;
    ArpIcmpResponder() arp_icmp;

    apply {
        if (ig_md.pass_type != PASS_FIRST) {
            // A later pass: the entry and the decision the pass before left.
            ig_md.pool_index = hdr.switchml_md.pool_index;
            ig_md.value_op = hdr.switchml_md.value_op;
        } else if (hdr.switchml.isValid()) {
            slot_offset.apply(hdr, ig_md);
            worker_lookup.apply(hdr, ig_md);
            if (ig_md.drop == 0) {
                check_packet.apply(hdr, ig_md, ig_prsr_md);
                pool_address.apply(hdr, ig_md);
            }
        } else {
            arp_icmp.apply(hdr, ig_intr_md, ig_dprsr_md, ig_tm_md);
        }

        if (hdr.switchml.isValid() && ig_md.drop == 0) {
            if (ig_md.pass_type == PASS_FIRST && ig_md.slot_room == 0) {
                reject_slot.apply(ig_md);  // slot index >= P
            } else {
                if (ig_md.pass_type == PASS_FIRST) {
                    worker_bitmap.apply(hdr.switchml.set, ig_md);
                }
                count_workers.apply(ig_md);
                exponents.apply(hdr.switchml, ig_md);
                aggregate.apply(hdr.values_first, hdr.values_second, ig_md);
                if (ig_md.pass_type == PASS_FIRST) {
                    next_step.apply(hdr, ig_md, ig_intr_md, ig_tm_md);
                } else {
                    next_pass.apply(hdr, ig_md, ig_intr_md, ig_tm_md);
                }
            }
        }

        if (hdr.switchml.isValid() && ig_md.pass_type == PASS_FIRST) {
            count_actions.apply(ig_md);
        }
        if (ig_md.drop == 1) {
            ig_dprsr_md.drop_ctl = 1;
        }
    }
}

control Egress(
    inout header_t hdr,
    inout egress_metadata_t eg_md,
    in egress_intrinsic_metadata_t eg_intr_md,
    in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
    inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
    inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {

    RewriteResult() rewrite_result;

    apply {
        rewrite_result.apply(hdr, eg_intr_md, eg_dprsr_md);
    }
}

Pipeline(
    IngressParser(),
    Ingress(),
    IngressDeparser(),
    EgressParser(),
    Egress(),
    EgressDeparser()) pipe;

Switch(pipe) main;
