/*
 * checks.p4 -- the counted drops after the worker lookup, and where the
 * packet's (slot, set) lives in the registers.
 *
 * docs/protocol.md section 2 orders the checks: unknown source (WorkerLookup) ->
 * malformed (section 1, CheckPacket) -> slot index >= P (RejectSlot). A packet of a size code other than
 * the job's is malformed too; it is counted apart, as the emulator does.
 */

#ifndef _CHECKS_P4_
#define _CHECKS_P4_

#include "configuration.p4"
#include "types.p4"
#include "headers.p4"

control CheckPacket(
    in header_t hdr,
    inout ingress_metadata_t ig_md,
    in ingress_intrinsic_metadata_from_parser_t ig_prsr_md) {

    action well_formed() {
    }

    action malformed() {
        ig_md.drop = 1;
        ig_md.action_code = ACTION_DROP_MALFORMED;
    }

    action wrong_size() {
        ig_md.drop = 1;
        ig_md.action_code = ACTION_DROP_WRONG_SIZE;
    }

    // Section 1: msg_type must be 1 and the UDP length must be the one of the
    // packet's size code; then the size code must be the job's. Anything that
    // matches no entry (another msg_type, a length that fits no size code) is
    // malformed. Only size codes 1 and 3 are accepted: a job of another code
    // cannot be programmed on this switch.
    table check_packet {
        key = {
            hdr.switchml.msg_type : ternary;
            hdr.switchml.size : ternary;
            hdr.udp.len : ternary;
            ig_md.size_code : ternary;
        }
        actions = {
            well_formed;
            wrong_size;
            @defaultonly malformed;
        }
        const entries = {
            // msg_type          size  UDP length        job's code
            (MSG_TYPE_SWITCHML,  1,    UDP_LENGTH_CODE1, 1) : well_formed();
            (MSG_TYPE_SWITCHML,  3,    UDP_LENGTH_CODE3, 3) : well_formed();
            (MSG_TYPE_SWITCHML,  0,    UDP_LENGTH_CODE0, _) : wrong_size();
            (MSG_TYPE_SWITCHML,  1,    UDP_LENGTH_CODE1, _) : wrong_size();
            (MSG_TYPE_SWITCHML,  2,    UDP_LENGTH_CODE2, _) : wrong_size();
            (MSG_TYPE_SWITCHML,  3,    UDP_LENGTH_CODE3, _) : wrong_size();
            (MSG_TYPE_SWITCHML,  4,    UDP_LENGTH_CODE4, _) : wrong_size();
            (MSG_TYPE_SWITCHML,  5,    UDP_LENGTH_CODE5, _) : wrong_size();
            (MSG_TYPE_SWITCHML,  6,    UDP_LENGTH_CODE6, _) : wrong_size();
            (MSG_TYPE_SWITCHML,  7,    UDP_LENGTH_CODE7, _) : wrong_size();
        }
        const default_action = malformed();
        size = 16;
    }

    apply {
        // slot < P  <=>  P - slot > 0 (saturating: no wrap for slot > P)
        ig_md.slot_room = ig_md.pool_size |-| ig_md.slot;
        // number of workers still missing once the first packet has arrived
        ig_md.count_start = ig_md.num_workers - 1;

        if (ig_prsr_md.parser_err != 0) {
            // the datagram ended inside the values: shorter than its size code
            malformed();
        } else {
            check_packet.apply();
        }
    }
}

// The last check: slot index >= P. Ingress applies it when CheckPacket let
// the packet through and slot_room == 0. It is a control of its own so that
// the test (a gateway on values CheckPacket computed) sits in the same stage
// as the bitmap update it guards, instead of costing a stage before it.
control RejectSlot(inout ingress_metadata_t ig_md) {

    action slot_out_of_range() {
        ig_md.drop = 1;
        ig_md.action_code = ACTION_DROP_SLOT_RANGE;
    }

    apply {
        slot_out_of_range();
    }
}

// The registers hold all jobs' pools side by side: a job's slot s is entry
// pool_base + s of the per-slot registers (the bitmap pair) and entry
// (pool_base + s) ++ set of the per-(slot, set) registers (count, exponents,
// values). A size-code-3 slot takes four entries, pool_base + 4s .. + 4s + 3,
// one per quarter of its values: the bitmap, count and exponents live in the
// first, and the consume passes move on to the next (passes.p4). The control
// plane gives jobs disjoint ranges, so two jobs with the same job_number and
// slot numbers never touch each other's state.
control PoolAddress(
    in header_t hdr,
    inout ingress_metadata_t ig_md) {

    // The hash unit concatenates fields for free (identity hash).
    Hash<pool_index_t>(HashAlgorithm_t.IDENTITY) pool_index_hash;

    apply {
        // slot_index = pool_base + slot (size code 3: + 4 slot). A Tofino ALU
        // instruction cannot shift one operand and add in the same stage, so
        // the addition takes the offset from the PHV: slot_offset, computed by
        // SlotOffset in the first stage from the packet's own size code.
        ig_md.slot_index = ig_md.pool_base + ig_md.slot_offset;
#ifdef P4TESTGEN
        // For P4Testgen only (p4/testgen/generate.py): what the identity hash
        // computes, the concatenation, written out. Its concolic hashes lose
        // the packet's values (a register index off the packet's slot).
        ig_md.pool_index = (bit<(16 - POOL_INDEX_BITS)>) 0 ++ ig_md.slot_index ++ hdr.switchml.set;
#else
        ig_md.pool_index = pool_index_hash.get({(bit<(16 - POOL_INDEX_BITS)>) 0, ig_md.slot_index, hdr.switchml.set});
#endif
    }
}

// The packet's slot as the metadata the checks and the pool address compute
// with: slot (16 bits, for slot_room) and its offset in the job's pool,
// slot_offset = slot (size code 1) or 4 slot (size code 3). Both come out of
// the hash unit (identity hash: a copy, the 4 slot a bit-slice with two 0
// bits appended), not the ALU: an ALU instruction takes its operands at the
// same bit positions of their containers, and the slot sits in bits 13..0 of
// the header's pool_index (after set and pool_index_unused), which neither a
// 16-bit subtraction nor a shift by 2 can line up with (bf-p4c: "invalid
// SuperCluster ... slice list is not byte-sized"). It depends on the
// packet's headers only, so it runs in the first stage beside the worker
// lookup; it takes the packet's size code, which CheckPacket compares with
// the job's: a packet whose code is not the job's is dropped before its slot
// is used.
control SlotOffset(
    in header_t hdr,
    inout ingress_metadata_t ig_md) {

    Hash<pool_size_t>(HashAlgorithm_t.IDENTITY) slot_hash;
    Hash<slot_index_t>(HashAlgorithm_t.IDENTITY) one_entry_hash;
    Hash<slot_index_t>(HashAlgorithm_t.IDENTITY) four_entries_hash;

    apply {
#ifdef P4TESTGEN
        // For P4Testgen only: the identity hashes written out (see PoolAddress).
        ig_md.slot = (pool_size_t) hdr.switchml.slot;
        if (hdr.switchml.size == SIZE_CODE_FOUR_PASSES) {
            ig_md.slot_offset = hdr.switchml.slot[POOL_SLOT_BITS - 3:0] ++ 2w0;
        } else {
            ig_md.slot_offset = hdr.switchml.slot[POOL_SLOT_BITS - 1:0];
        }
#else
        ig_md.slot = slot_hash.get({hdr.switchml.slot});
        if (hdr.switchml.size == SIZE_CODE_FOUR_PASSES) {
            ig_md.slot_offset = four_entries_hash.get({hdr.switchml.slot[POOL_SLOT_BITS - 3:0], 2w0});
        } else {
            ig_md.slot_offset = one_entry_hash.get({hdr.switchml.slot[POOL_SLOT_BITS - 1:0]});
        }
#endif
    }
}

#endif /* _CHECKS_P4_ */
