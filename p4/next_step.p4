/*
 * next_step.p4 -- docs/protocol.md section 2, step 5: what to send.
 *
 * The next_step table below IS the decision table of section 2 (and of the
 * theory-of-operation comment in swemu/core/engine.py):
 *
 *   retransmission  last  count==0 | next step          Action
 *   --------------  ----  -------- | -----------------  ------------------
 *   no              no    -        | nothing            AGGREGATED
 *   no              yes   -        | multicast          MULTICAST
 *   yes             -     no       | nothing            RETRANSMIT_PENDING
 *   yes             -     yes      | unicast to sender  UNICAST
 *
 * retransmission is map_result != 0. CountWorkers leaves in ig_md.count the
 * count *after* this packet, so for a new contribution "last" is
 * ig_md.count == 0 (count was 1 before the decrement, or W = 1), and for a
 * retransmission "count == 0" is the same test: both columns are one key.
 *
 * Size code 1: a result leaves in two passes: this one returned the first
 * half of every value pair and e0; the harvest pass (recirculation through
 * this pipe) returns the second halves and e1, then NextPass (passes.p4)
 * sends it.
 *
 * Size code 3: this pass aggregated the first quarter of the values; every
 * packet that changes the values or asks for a result goes round for the
 * other three (consume passes), carrying what this pass decided: write or
 * add (bitmap before == 0: write) or read, and whether and how a result is
 * sent. Only a retransmission into an incomplete slot ends here. The Action
 * counted is the same as for size code 1.
 *
 * The result header is the triggering packet's: msg_type, size code,
 * job_number, tsi and pool_index are kept, bit 14 of pool_index is cleared,
 * and so is the format bit ("unused") unless the job registered the 16-bit
 * format (VALUE_FORMATS_INT32_AND_BLOCK16), whose results say the format of
 * the packet that triggered them (docs/protocol.md section 4.2).
 */

#ifndef _NEXT_STEP_P4_
#define _NEXT_STEP_P4_

#include "configuration.p4"
#include "types.p4"
#include "headers.p4"

control NextStep(
    inout header_t hdr,
    inout ingress_metadata_t ig_md,
    in ingress_intrinsic_metadata_t ig_intr_md,
    inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {

    // Send the packet round once more, as pass `next` on register entry `index`.
    action recirculate(in pass_type_t next, in pool_index_t index, in value_op_t op,
                       in bit<1> result, in bit<1> multicast) {
        hdr.switchml_md.setValid();
        hdr.switchml_md.pass_type = next;
        hdr.switchml_md.value_op = op;
        hdr.switchml_md.result = result;
        hdr.switchml_md.multicast = multicast;
        hdr.switchml_md._pad0 = 0;
        hdr.switchml_md.ingress_port = ig_intr_md.ingress_port;
        hdr.switchml_md.mgid = ig_md.mgid;
        hdr.switchml_md.pool_index = index;
        hdr.switchml.pool_index_unused = 0;
        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port[8:7] ++ RECIRCULATION_PORT_IN_PIPE;
        ig_tm_md.bypass_egress = 1;
    }

    // Size code 1: read the rest of the result (the values stay in the packet).
    action harvest(in bit<1> multicast) {
        recirculate(PASS_HARVEST, ig_md.pool_index, VALUE_OP_READ, 1, multicast);
    }

    action multicast_result() {
        harvest(1);
        ig_md.action_code = ACTION_MULTICAST;
    }

    action unicast_result() {
        harvest(0);
        ig_md.action_code = ACTION_UNICAST;
    }

    // Size code 3: this quarter is done with; on to the next quarter's entry
    // (pool_index = slot_index ++ set, so the next entry is 2 further on).
    action consume(in value_op_t op, in bit<1> result, in bit<1> multicast) {
        hdr.values_first.setInvalid();
        hdr.values_second.setInvalid();
        recirculate(PASS_CONSUME1, ig_md.pool_index + 2, op, result, multicast);
    }

    action consume_multicast(value_op_t op) {
        consume(op, 1, 1);
        ig_md.action_code = ACTION_MULTICAST;
    }

    action consume_aggregated(value_op_t op) {
        consume(op, 0, 0);
        ig_md.action_code = ACTION_AGGREGATED;
    }

    action consume_unicast() {
        consume(VALUE_OP_READ, 1, 0);
        ig_md.action_code = ACTION_UNICAST;
    }

    action aggregated() {
        ig_md.drop = 1;
        ig_md.action_code = ACTION_AGGREGATED;
    }

    action retransmit_pending() {
        ig_md.drop = 1;
        ig_md.action_code = ACTION_RETRANSMIT_PENDING;
    }

    table next_step {
        key = {
            ig_md.size_code : ternary;              // the job's (= the packet's) size code
            ig_md.map_result : ternary;             // 0: new contribution; != 0: retransmission
            ig_md.count : ternary;                  // workers still missing after this packet
            ig_md.worker_bitmap_before : ternary;   // 0: the set was released (write, not add)
        }
        actions = {
            multicast_result;
            aggregated;
            unicast_result;
            retransmit_pending;
            consume_multicast;
            consume_aggregated;
            consume_unicast;
        }
        const entries = {
            // size  map_result  count  bitmap before
            (1,      32w0,       8w0,   _)    : multicast_result();    // new, last: result to every worker
            (1,      32w0,       _,     _)    : aggregated();          // new, not last: nothing sent
            (1,      _,          8w0,   _)    : unicast_result();      // retransmission, complete: to the sender only
            (1,      _,          _,     _)    : retransmit_pending();  // retransmission, incomplete: the multicast will come
            (3,      32w0,       8w0,   32w0) : consume_multicast(VALUE_OP_WRITE);   // new, last (W = 1)
            (3,      32w0,       8w0,   _)    : consume_multicast(VALUE_OP_ADD);     // new, last
            (3,      32w0,       _,     32w0) : consume_aggregated(VALUE_OP_WRITE);  // new, first
            (3,      32w0,       _,     _)    : consume_aggregated(VALUE_OP_ADD);    // new, neither
            (3,      _,          8w0,   _)    : consume_unicast();     // retransmission, complete
            (3,      _,          _,     _)    : retransmit_pending();  // retransmission, incomplete
        }
        size = 16;
    }

    apply {
        next_step.apply();
        if (ig_md.value_formats == VALUE_FORMATS_INT32) {
            hdr.switchml.unused = 0;   // as p4app-switchML: 0 in results
        }
    }
}

#endif /* _NEXT_STEP_P4_ */
