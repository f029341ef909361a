/*
 * aggregate.p4 -- PROTOCOL.md section 2, step 4: the 64 accumulators of a
 * (slot, set).
 *
 *   bitmap before == 0 (first contribution since the set was released): write
 *   new contribution (map_result == 0):                                   add
 *   retransmission (map_result != 0):                                     nothing
 *
 * Addition is 32-bit two's complement and wraps, as the emulator's does.
 *
 * Layout: 32 register pairs; pair i holds values i (first) and i + 32
 * (second). A stateful ALU updates both halves of its pair but returns only
 * 32 bits per access, so a pass can return one half of every pair: the first
 * pass returns the first halves (the sums after this packet) into v00..v31,
 * and the harvest pass of a result -- one more trip through the pipe, for
 * result packets only -- returns the second halves into v32..v63. 32 pairs
 * take 32 of the pipe's 48 stateful ALUs, four per stage.
 */

#ifndef _AGGREGATE_P4_
#define _AGGREGATE_P4_

#include "configuration.p4"
#include "types.p4"
#include "headers.p4"

control ValuePair(
    inout value_t first,
    inout value_t second,
    in ingress_metadata_t ig_md) {

    Register<value_pair_t, pool_index_t>(2 * NUM_POOL_SLOTS) values;

    RegisterAction<value_pair_t, pool_index_t, value_t>(values) write_read_first = {
        void apply(inout value_pair_t value, out value_t result) {
            value.first = first;
            value.second = second;
            result = value.first;
        }
    };

    RegisterAction<value_pair_t, pool_index_t, value_t>(values) add_read_first = {
        void apply(inout value_pair_t value, out value_t result) {
            value.first = value.first + first;
            value.second = value.second + second;
            result = value.first;
        }
    };

    RegisterAction<value_pair_t, pool_index_t, value_t>(values) read_first = {
        void apply(inout value_pair_t value, out value_t result) {
            result = value.first;
        }
    };

    RegisterAction<value_pair_t, pool_index_t, value_t>(values) read_second = {
        void apply(inout value_pair_t value, out value_t result) {
            result = value.second;
        }
    };

    action write() {
        first = write_read_first.execute(ig_md.pool_index);
    }

    action add() {
        first = add_read_first.execute(ig_md.pool_index);
    }

    action read() {
        first = read_first.execute(ig_md.pool_index);
    }

    action harvest() {
        second = read_second.execute(ig_md.pool_index);
    }

    table aggregate {
        key = {
            ig_md.harvest : ternary;
            ig_md.worker_bitmap_before : ternary;
            ig_md.map_result : ternary;
        }
        actions = {
            write;
            add;
            read;
            harvest;
        }
        const entries = {
            // harvest  bitmap before  map_result
            (1,         _,             _)    : harvest();  // result pass: fetch the second halves
            (0,         32w0,          _)    : write();    // the set was released: overwrite
            (0,         _,             32w0) : add();      // a new contribution
            (0,         _,             _)    : read();     // a retransmission: nothing changes
        }
        size = 4;
    }

    apply {
        aggregate.apply();
    }
}

control Aggregate(
    inout switchml_values_h v,
    in ingress_metadata_t ig_md) {

    ValuePair() pair00;
    ValuePair() pair01;
    ValuePair() pair02;
    ValuePair() pair03;
    ValuePair() pair04;
    ValuePair() pair05;
    ValuePair() pair06;
    ValuePair() pair07;
    ValuePair() pair08;
    ValuePair() pair09;
    ValuePair() pair10;
    ValuePair() pair11;
    ValuePair() pair12;
    ValuePair() pair13;
    ValuePair() pair14;
    ValuePair() pair15;
    ValuePair() pair16;
    ValuePair() pair17;
    ValuePair() pair18;
    ValuePair() pair19;
    ValuePair() pair20;
    ValuePair() pair21;
    ValuePair() pair22;
    ValuePair() pair23;
    ValuePair() pair24;
    ValuePair() pair25;
    ValuePair() pair26;
    ValuePair() pair27;
    ValuePair() pair28;
    ValuePair() pair29;
    ValuePair() pair30;
    ValuePair() pair31;

    apply {
        pair00.apply(v.v00, v.v32, ig_md);
        pair01.apply(v.v01, v.v33, ig_md);
        pair02.apply(v.v02, v.v34, ig_md);
        pair03.apply(v.v03, v.v35, ig_md);
        pair04.apply(v.v04, v.v36, ig_md);
        pair05.apply(v.v05, v.v37, ig_md);
        pair06.apply(v.v06, v.v38, ig_md);
        pair07.apply(v.v07, v.v39, ig_md);
        pair08.apply(v.v08, v.v40, ig_md);
        pair09.apply(v.v09, v.v41, ig_md);
        pair10.apply(v.v10, v.v42, ig_md);
        pair11.apply(v.v11, v.v43, ig_md);
        pair12.apply(v.v12, v.v44, ig_md);
        pair13.apply(v.v13, v.v45, ig_md);
        pair14.apply(v.v14, v.v46, ig_md);
        pair15.apply(v.v15, v.v47, ig_md);
        pair16.apply(v.v16, v.v48, ig_md);
        pair17.apply(v.v17, v.v49, ig_md);
        pair18.apply(v.v18, v.v50, ig_md);
        pair19.apply(v.v19, v.v51, ig_md);
        pair20.apply(v.v20, v.v52, ig_md);
        pair21.apply(v.v21, v.v53, ig_md);
        pair22.apply(v.v22, v.v54, ig_md);
        pair23.apply(v.v23, v.v55, ig_md);
        pair24.apply(v.v24, v.v56, ig_md);
        pair25.apply(v.v25, v.v57, ig_md);
        pair26.apply(v.v26, v.v58, ig_md);
        pair27.apply(v.v27, v.v59, ig_md);
        pair28.apply(v.v28, v.v60, ig_md);
        pair29.apply(v.v29, v.v61, ig_md);
        pair30.apply(v.v30, v.v62, ig_md);
        pair31.apply(v.v31, v.v63, ig_md);
    }
}

#endif /* _AGGREGATE_P4_ */
