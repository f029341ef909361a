/*
 * count.p4 -- docs/protocol.md section 2, step 3: count the workers still missing.
 *
 * count[set][slot] is how many workers are still missing (0 = idle or
 * complete). A new contribution finding count == 0 is the first: count
 * becomes W - 1; otherwise count -= 1. A retransmission only reads count.
 *
 * The register returns the count after this packet, which is all the next
 * step needs: for a new contribution "count == 0 after" is exactly "count was
 * 1 before the decrement", i.e. the last packet -- and with W = 1 every new
 * contribution is first and last and count stays 0. For a retransmission
 * "count == 0" means the slot is complete.
 */

#ifndef _COUNT_P4_
#define _COUNT_P4_

#include "configuration.p4"
#include "types.p4"
#include "bitmap.p4"

control CountWorkers(inout ingress_metadata_t ig_md) {

    Register<count_t, pool_index_t>(2 * NUM_POOL_SLOTS) count;

    RegisterAction<count_t, pool_index_t, count_t>(count) count_contribution = {
        void apply(inout count_t value, out count_t missing) {
            if (value == 0) {
                value = ig_md.count_start;
            } else {
                value = value - 1;
            }
            missing = value;
        }
    };

    RegisterAction<count_t, pool_index_t, count_t>(count) count_read = {
        void apply(inout count_t value, out count_t missing) {
            missing = value;
        }
    };

    action new_contribution() {
        ig_md.count = count_contribution.execute(ig_md.pool_index);
    }

    action retransmission() {
        ig_md.count = count_read.execute(ig_md.pool_index);
    }

    // Retransmission <=> the worker's bit was already set (see bitmap.p4 for
    // why this stage matches the bitmap instead of reading map_result).
    table count_workers {
        key = {
            ig_md.pass_type : ternary;
            ig_md.worker_id : ternary;
            ig_md.worker_bitmap_before : ternary;
        }
        actions = {
            new_contribution;
            retransmission;
            NoAction;
        }
        const entries = {
            (PASS_FIRST, _, 32w0) : new_contribution(); // the set was released: cannot be a retransmission
            RETRANSMISSION(0) : retransmission();
            RETRANSMISSION(1) : retransmission();
            RETRANSMISSION(2) : retransmission();
            RETRANSMISSION(3) : retransmission();
            RETRANSMISSION(4) : retransmission();
            RETRANSMISSION(5) : retransmission();
            RETRANSMISSION(6) : retransmission();
            RETRANSMISSION(7) : retransmission();
            RETRANSMISSION(8) : retransmission();
            RETRANSMISSION(9) : retransmission();
            RETRANSMISSION(10) : retransmission();
            RETRANSMISSION(11) : retransmission();
            RETRANSMISSION(12) : retransmission();
            RETRANSMISSION(13) : retransmission();
            RETRANSMISSION(14) : retransmission();
            RETRANSMISSION(15) : retransmission();
            RETRANSMISSION(16) : retransmission();
            RETRANSMISSION(17) : retransmission();
            RETRANSMISSION(18) : retransmission();
            RETRANSMISSION(19) : retransmission();
            RETRANSMISSION(20) : retransmission();
            RETRANSMISSION(21) : retransmission();
            RETRANSMISSION(22) : retransmission();
            RETRANSMISSION(23) : retransmission();
            RETRANSMISSION(24) : retransmission();
            RETRANSMISSION(25) : retransmission();
            RETRANSMISSION(26) : retransmission();
            RETRANSMISSION(27) : retransmission();
            RETRANSMISSION(28) : retransmission();
            RETRANSMISSION(29) : retransmission();
            RETRANSMISSION(30) : retransmission();
            RETRANSMISSION(31) : retransmission();
            (PASS_FIRST, _, _) : new_contribution();   // any other worker's packet
        }
        const default_action = NoAction();   // later passes: counted on the first
        size = 40;
    }

    apply {
        count_workers.apply();
    }
}

#endif /* _COUNT_P4_ */
