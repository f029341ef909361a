/*
 * bitmap.p4 -- docs/protocol.md section 2, steps 1 and 2: record the contribution
 * and tell a retransmission.
 *
 *   before = bitmap[set][slot]
 *   bitmap[set][slot]   |= b       (b = 1 << worker id)
 *   bitmap[1-set][slot] &= ~b
 *   retransmission = (before & b) != 0      -- map_result != 0
 *
 * Clearing the other set is what makes the shadow copy work: a worker uses
 * set s of a slot again only after it received the slot's result of the
 * other set. Both sets' bitmaps of a slot form one register pair, so the one
 * register access a packet gets per stage updates both.
 */

#ifndef _BITMAP_P4_
#define _BITMAP_P4_

#include "configuration.p4"
#include "types.p4"

// The stage right after the bitmap cannot read map_result yet (it is
// computed in that same stage), so the tables that must act there (count and
// exponents) recognise a retransmission from the bitmap itself, one ternary
// entry per worker: key (pass_type, worker_id, worker_bitmap_before), and
// worker w retransmits iff bit w of the bitmap before was already set. Only
// the first pass of a packet updates the bitmap, so only it matches.
#define RETRANSMISSION(w) (PASS_FIRST, w, (32w1 << w) &&& (32w1 << w))

control UpdateWorkerBitmap(
    in bit<1> set,
    inout ingress_metadata_t ig_md) {

    Register<bitmap_pair_t, slot_index_t>(NUM_POOL_SLOTS) worker_bitmap;

    RegisterAction<bitmap_pair_t, slot_index_t, worker_bitmap_t>(worker_bitmap) update_set0 = {
        void apply(inout bitmap_pair_t value, out worker_bitmap_t before) {
            before = value.set0;
            value.set0 = value.set0 | ig_md.worker_bit;
            value.set1 = value.set1 & ~ig_md.worker_bit;
        }
    };

    RegisterAction<bitmap_pair_t, slot_index_t, worker_bitmap_t>(worker_bitmap) update_set1 = {
        void apply(inout bitmap_pair_t value, out worker_bitmap_t before) {
            before = value.set1;
            value.set1 = value.set1 | ig_md.worker_bit;
            value.set0 = value.set0 & ~ig_md.worker_bit;
        }
    };

    action contribute_to_set0() {
        ig_md.worker_bitmap_before = update_set0.execute(ig_md.slot_index);
    }

    action contribute_to_set1() {
        ig_md.worker_bitmap_before = update_set1.execute(ig_md.slot_index);
    }

    table update_bitmap {
        key = {
            set : exact;
        }
        actions = {
            contribute_to_set0;
            contribute_to_set1;
        }
        const entries = {
            0 : contribute_to_set0();
            1 : contribute_to_set1();
        }
        size = 2;
    }

    apply {
        update_bitmap.apply();
        ig_md.map_result = ig_md.worker_bitmap_before & ig_md.worker_bit;
    }
}

#endif /* _BITMAP_P4_ */
