/*
 * worker_lookup.p4 -- who sent this packet (docs/protocol.md section 2, first check).
 *
 * A worker is identified by the packet's source address alone. The control
 * plane (section 5, UdpSession) installs one entry per registered worker:
 *   - in worker_by_address, keyed (ipv4, udp_port), when it registered a port;
 *   - in worker_by_ip, keyed (ipv4), when it registered udp_port 0 ("by IP
 *     alone", as p4app-switchML does).
 * (ipv4, port) is looked up first, then (ipv4, 0): the second table holds the
 * (ipv4, 0) entries. An address belongs to at most one worker of one job, so
 * registering it again modifies its entry (that moves it). job_number plays
 * no part: two jobs may use the same job_number and slots.
 *
 * Unknown sources are dropped and counted under job 0.
 */

#ifndef _WORKER_LOOKUP_P4_
#define _WORKER_LOOKUP_P4_

#include "configuration.p4"
#include "types.p4"
#include "headers.p4"

control WorkerLookup(
    in header_t hdr,
    inout ingress_metadata_t ig_md) {

    // All that the switch knows about a worker and its job. worker_bit is
    // 1 << worker_id, given by the control plane because an action cannot
    // shift by a run-time amount.
    action set_worker(
            job_id_t job_id,
            worker_id_t worker_id,
            worker_bitmap_t worker_bit,
            num_workers_t num_workers,
            size_code_t size_code,
            slot_index_t pool_base,
            pool_size_t pool_size,
            MulticastGroupId_t mgid,
            value_formats_t value_formats) {
        ig_md.job_id = job_id;
        ig_md.worker_id = worker_id;
        ig_md.worker_bit = worker_bit;
        ig_md.num_workers = num_workers;
        ig_md.size_code = size_code;
        ig_md.pool_base = pool_base;
        ig_md.pool_size = pool_size;
        ig_md.mgid = mgid;
        ig_md.value_formats = value_formats;
#ifdef P4TESTGEN
        // The entries the controller writes (p4/controller, docs/protocol.md
        // section 5): what p4-constraints' @entry_restriction would say, which
        // P4Testgen's Tofino target does not read. The generator then spends
        // its tests on control planes that exist, not on W = 0 or a worker_bit
        // that is not 1 << worker_id.
        testgen_assume(job_id != 0
            && num_workers >= 1 && num_workers <= MAX_WORKERS
            && (bit<8>)worker_id < num_workers
            && worker_bit == (worker_bitmap_t)1 << (worker_bitmap_t)worker_id
            && pool_size >= 1
            && ((size_code == SIZE_CODE_ONE_PASS
                    && (bit<32>)pool_base + (bit<32>)pool_size <= NUM_POOL_SLOTS)
                || (size_code == SIZE_CODE_FOUR_PASSES
                    && (bit<32>)pool_base + 4 * (bit<32>)pool_size <= NUM_POOL_SLOTS)));
#endif
    }

    action unknown_source() {
        ig_md.drop = 1;
        ig_md.action_code = ACTION_DROP_UNKNOWN_SOURCE;
    }

    table worker_by_address {
        key = {
            hdr.ipv4.src_addr : exact;
            hdr.udp.src_port : exact;
        }
        actions = {
            set_worker;
            @defaultonly NoAction;
        }
        const default_action = NoAction();
        size = MAX_WORKER_ENTRIES;
    }

    table worker_by_ip {
        key = {
            hdr.ipv4.src_addr : exact;
        }
        actions = {
            set_worker;
            @defaultonly unknown_source;
        }
        const default_action = unknown_source();
        size = MAX_WORKER_ENTRIES;
    }

    apply {
        if (!worker_by_address.apply().hit) {
            worker_by_ip.apply();
        }
    }
}

#endif /* _WORKER_LOOKUP_P4_ */
