/*
 * passes.p4 -- the later passes of a packet through its pipe (recirculation),
 * and sending the result at the end of the last one.
 *
 * A Tofino 1 pass can aggregate 64 values (32 register pairs, one stateful
 * ALU each) and return 32 of them (an ALU returns one half of its pair):
 *
 *   size code 1 (64 values): the first pass aggregates and returns values
 *     0..31; a result takes one more pass, PASS_HARVEST, for values 32..63.
 *   size code 3 (256 values): the first pass aggregates values 0..63 and
 *     drops them from the packet; PASS_CONSUME1..3 do the same for the next
 *     quarters, each on the slot's next register entry (pool_index + 2). A
 *     packet without a result ends after PASS_CONSUME3. A result then gets
 *     its 256 values back, 32 a pass, back to front, because the deparser can
 *     only put headers in front of the payload: PASS_COLLECT_3_SECOND puts
 *     values 224..255 in front of the (empty) payload, PASS_COLLECT_3_FIRST
 *     values 192..223 in front of those, ..., PASS_COLLECT_0_FIRST values
 *     0..31, and e1; then the result is sent. 4 passes per packet, 12 for a
 *     result (p4app-switchML spreads the quarters over the four pipes of a
 *     folded 64-port switch instead, with 11 passes for a result; here all of
 *     a job stays in the one pipe of its workers, at a quarter of the slots).
 *
 * Order: every later pass goes through the recirculation port of the pipe,
 * one FIFO queue, so the k-th passes of two packets reach the registers in
 * the order of their first passes. A result's collect passes therefore read
 * each quarter after every contribution to it, and a retransmission that is
 * answered (unicast) goes through the consume passes too (reading only), so
 * that it cannot overtake the last contribution's quarters.
 *
 * The next_pass table below is the pass chain; each pass reads and writes
 * register entry switchml_md.pool_index, set here for the next pass.
 */

#ifndef _PASSES_P4_
#define _PASSES_P4_

#include "configuration.p4"
#include "types.p4"
#include "headers.p4"

control NextPass(
    inout header_t hdr,
    inout ingress_metadata_t ig_md,
    in ingress_intrinsic_metadata_t ig_intr_md,
    inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {

    // Round once more, as pass `next`, on the entry `step` entries further
    // (pool_index counts (entry, set) pairs: one entry is 2).
    action go_round(in pass_type_t next, in pool_index_t step) {
        hdr.switchml_md.pass_type = next;
        hdr.switchml_md.pool_index = ig_md.pool_index + step;
        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port[8:7] ++ RECIRCULATION_PORT_IN_PIPE;
        ig_tm_md.bypass_egress = 1;
    }

    // Consume pass: these 64 values are aggregated, drop them from the packet.
    action consume_next(pass_type_t next) {
        hdr.values_first.setInvalid();
        hdr.values_second.setInvalid();
        go_round(next, 2);
    }

    // The last consume pass of a result: on to the collect passes, which
    // start with this (last) quarter.
    action consume_then_collect(pass_type_t next) {
        hdr.values_first.setInvalid();
        hdr.values_second.setInvalid();
        go_round(next, 0);
    }

    // Collect pass: the half read goes in front; the next pass reads the
    // other half of the same quarter, or a half of the quarter before.
    action collect_same_quarter(pass_type_t next) {
        go_round(next, 0);
    }

    action collect_quarter_before(pass_type_t next) {
        hdr.switchml_md.pass_type = next;
        hdr.switchml_md.pool_index = ig_md.pool_index - 2;
        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port[8:7] ++ RECIRCULATION_PORT_IN_PIPE;
        ig_tm_md.bypass_egress = 1;
    }

    // A size-code-3 contribution that sends nothing: all four quarters are in.
    action consumed() {
        ig_md.drop = 1;
    }

    // The result is complete: to every worker of the job (the multicast
    // group; egress writes each worker's address), or back to the sender.
    action to_all_workers() {
        ig_tm_md.mcast_grp_a = hdr.switchml_md.mgid;
        ig_tm_md.bypass_egress = 0;
    }

    action to_sender() {
        ig_tm_md.ucast_egress_port = hdr.switchml_md.ingress_port;
        ig_tm_md.bypass_egress = 0;
    }

    table next_pass {
        key = {
            hdr.switchml_md.pass_type : exact;
            hdr.switchml_md.result : exact;
            hdr.switchml_md.multicast : exact;
        }
        actions = {
            consume_next;
            consume_then_collect;
            collect_same_quarter;
            collect_quarter_before;
            consumed;
            to_all_workers;
            to_sender;
        }
        const entries = {
            // size code 1
            (PASS_HARVEST, 1, 1) : to_all_workers();
            (PASS_HARVEST, 1, 0) : to_sender();
            // size code 3: the other three quarters
            (PASS_CONSUME1, 0, 0) : consume_next(PASS_CONSUME2);
            (PASS_CONSUME1, 1, 0) : consume_next(PASS_CONSUME2);
            (PASS_CONSUME1, 1, 1) : consume_next(PASS_CONSUME2);
            (PASS_CONSUME2, 0, 0) : consume_next(PASS_CONSUME3);
            (PASS_CONSUME2, 1, 0) : consume_next(PASS_CONSUME3);
            (PASS_CONSUME2, 1, 1) : consume_next(PASS_CONSUME3);
            (PASS_CONSUME3, 0, 0) : consumed();
            (PASS_CONSUME3, 1, 0) : consume_then_collect(PASS_COLLECT_3_SECOND);
            (PASS_CONSUME3, 1, 1) : consume_then_collect(PASS_COLLECT_3_SECOND);
            // size code 3: the result, back to front
            (PASS_COLLECT_3_SECOND, 1, 0) : collect_same_quarter(PASS_COLLECT_3_FIRST);
            (PASS_COLLECT_3_SECOND, 1, 1) : collect_same_quarter(PASS_COLLECT_3_FIRST);
            (PASS_COLLECT_3_FIRST, 1, 0) : collect_quarter_before(PASS_COLLECT_2_SECOND);
            (PASS_COLLECT_3_FIRST, 1, 1) : collect_quarter_before(PASS_COLLECT_2_SECOND);
            (PASS_COLLECT_2_SECOND, 1, 0) : collect_same_quarter(PASS_COLLECT_2_FIRST);
            (PASS_COLLECT_2_SECOND, 1, 1) : collect_same_quarter(PASS_COLLECT_2_FIRST);
            (PASS_COLLECT_2_FIRST, 1, 0) : collect_quarter_before(PASS_COLLECT_1_SECOND);
            (PASS_COLLECT_2_FIRST, 1, 1) : collect_quarter_before(PASS_COLLECT_1_SECOND);
            (PASS_COLLECT_1_SECOND, 1, 0) : collect_same_quarter(PASS_COLLECT_1_FIRST);
            (PASS_COLLECT_1_SECOND, 1, 1) : collect_same_quarter(PASS_COLLECT_1_FIRST);
            (PASS_COLLECT_1_FIRST, 1, 0) : collect_quarter_before(PASS_COLLECT_0_SECOND);
            (PASS_COLLECT_1_FIRST, 1, 1) : collect_quarter_before(PASS_COLLECT_0_SECOND);
            (PASS_COLLECT_0_SECOND, 1, 0) : collect_same_quarter(PASS_COLLECT_0_FIRST);
            (PASS_COLLECT_0_SECOND, 1, 1) : collect_same_quarter(PASS_COLLECT_0_FIRST);
            (PASS_COLLECT_0_FIRST, 1, 1) : to_all_workers();
            (PASS_COLLECT_0_FIRST, 1, 0) : to_sender();
        }
        const default_action = consumed();   // no other combination is ever sent round
        size = 32;
    }

    apply {
        next_pass.apply();
    }
}

#endif /* _PASSES_P4_ */
