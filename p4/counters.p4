/*
 * counters.p4 -- per-job counters of what the switch did (docs/protocol.md
 * section 2: "Counters are kept per job and per reason").
 *
 * One packet-and-byte counter per (job, action code), with the action codes
 * of swemu.core.engine.Action: the three drop reasons after the lookup, and
 * AGGREGATED / MULTICAST / RETRANSMIT_PENDING / UNICAST. Unknown sources have
 * no job and are counted under job 0.
 */

#ifndef _COUNTERS_P4_
#define _COUNTERS_P4_

#include "configuration.p4"
#include "types.p4"

control CountActions(in ingress_metadata_t ig_md) {

    Counter<bit<32>, counter_index_t>(COUNTER_SIZE, CounterType_t.PACKETS_AND_BYTES) action_counter;

    // The hash unit concatenates job_id and action_code into the index.
    Hash<counter_index_t>(HashAlgorithm_t.IDENTITY) counter_index_hash;

    apply {
        action_counter.count(counter_index_hash.get({ig_md.job_id, ig_md.action_code}));
    }
}

#endif /* _COUNTERS_P4_ */
