/*
 * next_step.p4 -- PROTOCOL.md section 2, step 5: what to send.
 *
 * The next_step table below IS the decision table of section 2 (and of the
 * theory-of-operation comment in swemu/engine.py):
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
 * A result leaves in two passes: this one returned the first half of every
 * value pair and e0; the harvest pass (recirculation through this pipe)
 * returns the second halves and e1, then SendResult (result.p4) sends it.
 * The result header is the triggering packet's: msg_type, size code,
 * job_number, tsi and pool_index are kept, the unused bits are cleared.
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

    // Send the packet round once more to read the rest of the result.
    action harvest(in bit<1> multicast) {
        hdr.switchml_md.setValid();
        hdr.switchml_md.multicast = multicast;
        hdr.switchml_md._pad0 = 0;
        hdr.switchml_md.ingress_port = ig_intr_md.ingress_port;
        hdr.switchml_md.mgid = ig_md.mgid;
        hdr.switchml_md._pad1 = 0;
        hdr.switchml_md.pool_index = ig_md.pool_index;
        hdr.switchml.unused = 0;
        hdr.switchml.pool_index_unused = 0;
        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port[8:7] ++ RECIRCULATION_PORT_IN_PIPE;
        ig_tm_md.bypass_egress = 1;
    }

    action multicast_result() {
        harvest(1);
        ig_md.action_code = ACTION_MULTICAST;
    }

    action unicast_result() {
        harvest(0);
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
            ig_md.map_result : ternary;  // 0: new contribution; != 0: retransmission
            ig_md.count : ternary;       // workers still missing after this packet
        }
        actions = {
            multicast_result;
            aggregated;
            unicast_result;
            retransmit_pending;
        }
        const entries = {
            // map_result  count
            (32w0,         8w0) : multicast_result();    // new, last: result to every worker
            (32w0,         _)   : aggregated();          // new, not last: nothing sent
            (_,            8w0) : unicast_result();      // retransmission, complete: to the sender only
            (_,            _)   : retransmit_pending();  // retransmission, incomplete: the multicast will come
        }
        size = 4;
    }

    apply {
        next_step.apply();
    }
}

#endif /* _NEXT_STEP_P4_ */
