/*
 * aggregate.p4 -- docs/protocol.md section 2, step 4: the 64 accumulators of a
 * (slot, set).
 *
 *   bitmap before == 0 (first contribution since the set was released): write
 *   new contribution (map_result == 0):                                   add
 *   retransmission (map_result != 0):                                     nothing
 *
 * Addition is 32-bit two's complement and wraps, as the emulator's does.
 *
 * Layout: 32 register pairs; pair i holds values i (first) and i + 32
 * (second) of a pass, at the pass's register entry. A stateful ALU updates
 * both halves of its pair but returns only 32 bits per access, so a pass can
 * return one half of every pair:
 *   size code 1: the first pass returns the first halves (the sums after this
 *     packet) into values_first, and the harvest pass of a result -- one more
 *     trip through the pipe, for result packets only -- returns the second
 *     halves into values_second;
 *   size code 3: the first pass and the three consume passes write or add one
 *     quarter each (what they return is dropped with the consumed values), and
 *     the eight collect passes of a result return one half of a quarter each,
 *     into the half that is put in front of the values collected so far.
 * 32 pairs take 32 of the pipe's 48 stateful ALUs, four per stage. A register
 * has four RegisterActions at most (a Tofino 1 stateful ALU's four
 * instructions): write, add, read first, read second.
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

    // The first pass decides from the bitmap (section 2 step 4); the consume
    // passes of size code 3 do what the first pass decided (value_op).
    table aggregate {
        key = {
            ig_md.pass_type : ternary;
            ig_md.value_op : ternary;
            ig_md.worker_bitmap_before : ternary;
            ig_md.map_result : ternary;
        }
        actions = {
            write;
            add;
            read;
            harvest;
            NoAction;
        }
        const entries = {
            // pass                  value op         bitmap before  map_result
            (PASS_FIRST,             _,               32w0,          _)    : write();    // the set was released: overwrite
            (PASS_FIRST,             _,               _,             32w0) : add();      // a new contribution
            (PASS_FIRST,             _,               _,             _)    : read();     // a retransmission: nothing changes
            (PASS_HARVEST,           _,               _,             _)    : harvest();  // size code 1, result: the second halves
            (PASS_CONSUME1,          VALUE_OP_WRITE,  _,             _)    : write();
            (PASS_CONSUME1,          VALUE_OP_ADD,    _,             _)    : add();
            (PASS_CONSUME1,          VALUE_OP_READ,   _,             _)    : read();
            (PASS_CONSUME2,          VALUE_OP_WRITE,  _,             _)    : write();
            (PASS_CONSUME2,          VALUE_OP_ADD,    _,             _)    : add();
            (PASS_CONSUME2,          VALUE_OP_READ,   _,             _)    : read();
            (PASS_CONSUME3,          VALUE_OP_WRITE,  _,             _)    : write();
            (PASS_CONSUME3,          VALUE_OP_ADD,    _,             _)    : add();
            (PASS_CONSUME3,          VALUE_OP_READ,   _,             _)    : read();
            (PASS_COLLECT_3_SECOND,  _,               _,             _)    : harvest();  // values 224..255
            (PASS_COLLECT_3_FIRST,   _,               _,             _)    : read();     // values 192..223
            (PASS_COLLECT_2_SECOND,  _,               _,             _)    : harvest();
            (PASS_COLLECT_2_FIRST,   _,               _,             _)    : read();
            (PASS_COLLECT_1_SECOND,  _,               _,             _)    : harvest();
            (PASS_COLLECT_1_FIRST,   _,               _,             _)    : read();
            (PASS_COLLECT_0_SECOND,  _,               _,             _)    : harvest();
            (PASS_COLLECT_0_FIRST,   _,               _,             _)    : read();     // values 0..31
        }
        const default_action = NoAction();
        size = 32;
    }

    apply {
        aggregate.apply();
    }
}

control Aggregate(
    inout value_half_h first,
    inout value_half_h second,
    in ingress_metadata_t ig_md) {

    // A collect pass fills one half, which goes in front of the values
    // collected so far; the parser extracted none (passes.p4).
    action open_first() {
        first.setValid();
    }

    action open_second() {
        second.setValid();
    }

    table collect_half {
        key = {
            ig_md.pass_type : exact;
        }
        actions = {
            open_first;
            open_second;
            NoAction;
        }
        const entries = {
            PASS_COLLECT_3_SECOND : open_second();
            PASS_COLLECT_3_FIRST : open_first();
            PASS_COLLECT_2_SECOND : open_second();
            PASS_COLLECT_2_FIRST : open_first();
            PASS_COLLECT_1_SECOND : open_second();
            PASS_COLLECT_1_FIRST : open_first();
            PASS_COLLECT_0_SECOND : open_second();
            PASS_COLLECT_0_FIRST : open_first();
        }
        const default_action = NoAction();
        size = 16;
    }

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
        collect_half.apply();
        pair00.apply(first.v00, second.v00, ig_md);
        pair01.apply(first.v01, second.v01, ig_md);
        pair02.apply(first.v02, second.v02, ig_md);
        pair03.apply(first.v03, second.v03, ig_md);
        pair04.apply(first.v04, second.v04, ig_md);
        pair05.apply(first.v05, second.v05, ig_md);
        pair06.apply(first.v06, second.v06, ig_md);
        pair07.apply(first.v07, second.v07, ig_md);
        pair08.apply(first.v08, second.v08, ig_md);
        pair09.apply(first.v09, second.v09, ig_md);
        pair10.apply(first.v10, second.v10, ig_md);
        pair11.apply(first.v11, second.v11, ig_md);
        pair12.apply(first.v12, second.v12, ig_md);
        pair13.apply(first.v13, second.v13, ig_md);
        pair14.apply(first.v14, second.v14, ig_md);
        pair15.apply(first.v15, second.v15, ig_md);
        pair16.apply(first.v16, second.v16, ig_md);
        pair17.apply(first.v17, second.v17, ig_md);
        pair18.apply(first.v18, second.v18, ig_md);
        pair19.apply(first.v19, second.v19, ig_md);
        pair20.apply(first.v20, second.v20, ig_md);
        pair21.apply(first.v21, second.v21, ig_md);
        pair22.apply(first.v22, second.v22, ig_md);
        pair23.apply(first.v23, second.v23, ig_md);
        pair24.apply(first.v24, second.v24, ig_md);
        pair25.apply(first.v25, second.v25, ig_md);
        pair26.apply(first.v26, second.v26, ig_md);
        pair27.apply(first.v27, second.v27, ig_md);
        pair28.apply(first.v28, second.v28, ig_md);
        pair29.apply(first.v29, second.v29, ig_md);
        pair30.apply(first.v30, second.v30, ig_md);
        pair31.apply(first.v31, second.v31, ig_md);
    }
}

#endif /* _AGGREGATE_P4_ */
