/*
 * exponents.p4 -- docs/protocol.md section 2, step 4 for e0 and e1: signed
 * running maxima.
 *
 * First contribution to a released set (bitmap before == 0): write e0 and e1.
 * Other new contributions: max-reduce each, independently, as signed 8-bit
 * numbers. Retransmissions change nothing. The register returns one 8-bit
 * half per access, so the first pass returns e0 and the last pass of a
 * result (size code 1: the harvest pass; size code 3: the last collect pass)
 * returns e1. The other passes of size code 3 leave the exponents alone.
 */

#ifndef _EXPONENTS_P4_
#define _EXPONENTS_P4_

#include "configuration.p4"
#include "types.p4"
#include "headers.p4"
#include "bitmap.p4"

control Exponents(
    inout switchml_h switchml,
    in ingress_metadata_t ig_md) {

    Register<exponent_pair_t, pool_index_t>(2 * NUM_POOL_SLOTS) exponents;

    RegisterAction<exponent_pair_t, pool_index_t, exponent_t>(exponents) write_read_e0 = {
        void apply(inout exponent_pair_t value, out exponent_t e0) {
            value.e0 = switchml.e0;
            value.e1 = switchml.e1;
            e0 = value.e0;
        }
    };

    // exponent_t is int<8>: the comparisons are signed.
    RegisterAction<exponent_pair_t, pool_index_t, exponent_t>(exponents) max_read_e0 = {
        void apply(inout exponent_pair_t value, out exponent_t e0) {
            if (switchml.e0 > value.e0) {
                value.e0 = switchml.e0;
            }
            if (switchml.e1 > value.e1) {
                value.e1 = switchml.e1;
            }
            e0 = value.e0;
        }
    };

    RegisterAction<exponent_pair_t, pool_index_t, exponent_t>(exponents) read_e0 = {
        void apply(inout exponent_pair_t value, out exponent_t e0) {
            e0 = value.e0;
        }
    };

    RegisterAction<exponent_pair_t, pool_index_t, exponent_t>(exponents) read_e1 = {
        void apply(inout exponent_pair_t value, out exponent_t e1) {
            e1 = value.e1;
        }
    };

    action write() {
        switchml.e0 = write_read_e0.execute(ig_md.pool_index);
    }

    action max_reduce() {
        switchml.e0 = max_read_e0.execute(ig_md.pool_index);
    }

    action read() {
        switchml.e0 = read_e0.execute(ig_md.pool_index);
    }

    action harvest() {
        switchml.e1 = read_e1.execute(ig_md.pool_index);
    }

    // Same key as CountWorkers, for the same reason (see bitmap.p4).
    table exponents_max {
        key = {
            ig_md.pass_type : ternary;
            ig_md.worker_id : ternary;
            ig_md.worker_bitmap_before : ternary;
        }
        actions = {
            write;
            max_reduce;
            read;
            harvest;
            NoAction;
        }
        const entries = {
            (PASS_HARVEST, _, _) : harvest();           // size code 1, result: fetch e1
            (PASS_COLLECT_0_FIRST, _, _) : harvest();   // size code 3, last collect pass: fetch e1
            (PASS_FIRST, _, 32w0) : write();            // first contribution since the set was released
            RETRANSMISSION(0) : read();
            RETRANSMISSION(1) : read();
            RETRANSMISSION(2) : read();
            RETRANSMISSION(3) : read();
            RETRANSMISSION(4) : read();
            RETRANSMISSION(5) : read();
            RETRANSMISSION(6) : read();
            RETRANSMISSION(7) : read();
            RETRANSMISSION(8) : read();
            RETRANSMISSION(9) : read();
            RETRANSMISSION(10) : read();
            RETRANSMISSION(11) : read();
            RETRANSMISSION(12) : read();
            RETRANSMISSION(13) : read();
            RETRANSMISSION(14) : read();
            RETRANSMISSION(15) : read();
            RETRANSMISSION(16) : read();
            RETRANSMISSION(17) : read();
            RETRANSMISSION(18) : read();
            RETRANSMISSION(19) : read();
            RETRANSMISSION(20) : read();
            RETRANSMISSION(21) : read();
            RETRANSMISSION(22) : read();
            RETRANSMISSION(23) : read();
            RETRANSMISSION(24) : read();
            RETRANSMISSION(25) : read();
            RETRANSMISSION(26) : read();
            RETRANSMISSION(27) : read();
            RETRANSMISSION(28) : read();
            RETRANSMISSION(29) : read();
            RETRANSMISSION(30) : read();
            RETRANSMISSION(31) : read();
            (PASS_FIRST, _, _) : max_reduce();          // a new contribution
        }
        const default_action = NoAction();              // consume and other collect passes
        size = 40;
    }

    apply {
        exponents_max.apply();
    }
}

#endif /* _EXPONENTS_P4_ */
