/*
 * types.p4 -- typedefs, header types (_h), register layouts and metadata (_t).
 *
 * Names follow the Python side: pool_index, worker_bitmap, map_result,
 * job_number, tsi, num_workers, and "set" for the shadow copy.
 */

#ifndef _TYPES_P4_
#define _TYPES_P4_

#include "configuration.p4"

/* ---------------------------------------------------------------------------
 * Field types
 * ------------------------------------------------------------------------- */
typedef bit<48> mac_addr_t;
typedef bit<32> ipv4_addr_t;
typedef bit<16> udp_port_t;

typedef bit<4>  msg_type_t;
typedef bit<3>  size_code_t;
typedef bit<8>  job_number_t;       // opaque to the switch, echoed back
typedef bit<32> tsi_t;              // opaque to the switch, echoed back
typedef bit<SLOT_INDEX_BITS> slot_t;
typedef int<8>  exponent_t;         // signed: max-reduced as a signed number
typedef bit<32> value_t;            // int32 on the wire; addition wraps the same

typedef bit<MAX_WORKERS> worker_bitmap_t;   // bit w = worker w contributed
typedef bit<WORKER_ID_BITS> worker_id_t;
typedef bit<8>  num_workers_t;
typedef bit<8>  count_t;            // workers still missing for a (slot, set)
typedef bit<JOB_ID_BITS> job_id_t;
typedef bit<16> pool_size_t;
typedef bit<POOL_SLOT_BITS> slot_index_t;   // pool_base + slot: one entry per slot (4 at size code 3)
// slot_index ++ set: one entry per (slot, set), POOL_INDEX_BITS wide, held in 16 bits:
// the later passes add to it (+2: the next entry) in switchml_md, and a Tofino add
// works on a whole PHV container, so no other field may share its bytes.
typedef bit<16> pool_index_t;
typedef bit<3>  action_code_t;      // ACTION_* of configuration.p4
typedef bit<4>  pass_type_t;        // PASS_* of configuration.p4
typedef bit<2>  value_op_t;         // VALUE_OP_* of configuration.p4
typedef bit<1>  value_formats_t;    // VALUE_FORMATS_* of configuration.p4
typedef bit<COUNTER_INDEX_BITS> counter_index_t;

/* ---------------------------------------------------------------------------
 * Register layouts. A stateful ALU reads and writes one entry of up to
 * 2 x 32 bits per packet, so state that one packet must update together is
 * laid out as a pair.
 * ------------------------------------------------------------------------- */

// Both shadow sets' bitmaps of one slot: a packet for set s sets its bit in
// set s and clears it in set 1 - s, in one access.
struct bitmap_pair_t {
    worker_bitmap_t set0;
    worker_bitmap_t set1;
}

// Two of the 64 accumulators of one (entry, set): values i and i + 32 of a pass.
struct value_pair_t {
    value_t first;
    value_t second;
}

// The two running maxima of one (slot, set).
struct exponent_pair_t {
    exponent_t e0;
    exponent_t e1;
}

/* ---------------------------------------------------------------------------
 * Headers
 * ------------------------------------------------------------------------- */
header ethernet_h {
    mac_addr_t dst_addr;
    mac_addr_t src_addr;
    bit<16>    ether_type;
}

header arp_h {
    bit<16>     hw_type;
    bit<16>     proto_type;
    bit<8>      hw_addr_len;
    bit<8>      proto_addr_len;
    bit<16>     opcode;
    mac_addr_t  sender_hw_addr;
    ipv4_addr_t sender_proto_addr;
    mac_addr_t  target_hw_addr;
    ipv4_addr_t target_proto_addr;
}

header ipv4_h {
    bit<4>      version;
    bit<4>      ihl;
    bit<8>      diffserv;
    bit<16>     total_len;
    bit<16>     identification;
    bit<3>      flags;
    bit<13>     frag_offset;
    bit<8>      ttl;
    bit<8>      protocol;
    bit<16>     hdr_checksum;
    ipv4_addr_t src_addr;
    ipv4_addr_t dst_addr;
}

// Only the fixed part; an echo request's identifier, sequence number and
// data stay in the payload and are sent back unchanged.
header icmp_h {
    bit<8>  msg_type;
    bit<8>  code;
    bit<16> checksum;
}

header udp_h {
    udp_port_t src_port;
    udp_port_t dst_port;
    bit<16>    len;
    bit<16>    checksum;
}

// docs/protocol.md section 1, bit for bit (checked against swemu.protocol.wire by
// tests/test_p4_headers.py). Byte 0 is msg_type | unused | size; bytes 6-7
// are the pool_index: set (bit 15) | 0 (bit 14) | slot (bits 13..0).
// "unused" is the format bit of the 16-bit values (extension, section 4.2):
// the value words are added alike in both formats, and a result carries it
// only for a job registered with VALUE_FORMATS_INT32_AND_BLOCK16 (NextStep).
header switchml_h {
    msg_type_t   msg_type;           // 1
    bit<1>       unused;             // the format bit: echoed by 16-bit jobs, else 0 out
    size_code_t  size;               // payload size code: N = 32 << size
    job_number_t job_number;
    tsi_t        tsi;
    bit<1>       set;                // pool_index bit 15: shadow set
    bit<1>       pool_index_unused;  // pool_index bit 14: ignored on input, sent as 0
    slot_t       slot;               // pool_index bits 13..0
    exponent_t   e0;
    exponent_t   e1;
}

// Half of the 64 int32 values one pass aggregates. A pass extracts two
// (values_first, values_second: values 0..31 and 32..63 of the pass); register
// pair i of the Aggregate control holds values_first.v<i> (first) and
// values_second.v<i> (second). A collect pass of size code 3 adds one half in
// front of the values collected so far.
header value_half_h {
    value_t v00; value_t v01; value_t v02; value_t v03;
    value_t v04; value_t v05; value_t v06; value_t v07;
    value_t v08; value_t v09; value_t v10; value_t v11;
    value_t v12; value_t v13; value_t v14; value_t v15;
    value_t v16; value_t v17; value_t v18; value_t v19;
    value_t v20; value_t v21; value_t v22; value_t v23;
    value_t v24; value_t v25; value_t v26; value_t v27;
    value_t v28; value_t v29; value_t v30; value_t v31;
}

// Internal, never on a wire outside the switch. Put in front of Ethernet by
// the ingress deparser of a packet that goes round the pipe once more: it
// carries the first pass's decision through the later passes (recirculation)
// and on to egress.
header switchml_md_h {
    pass_type_t        pass_type;     // the pass the packet is about to make
    value_op_t         value_op;      // size code 3: write / add / read, for the consume passes
    bit<1>             result;        // 1: the last pass sends a result; 0: it only adds
    bit<1>             multicast;     // 1: to every worker of the job; 0: back to the sender
    bit<7>             _pad0;
    PortId_t           ingress_port;  // where the sender is (unicast)
    MulticastGroupId_t mgid;          // the job's multicast group
    pool_index_t       pool_index;    // the (entry, set) the next pass reads and writes
}

/* ---------------------------------------------------------------------------
 * Metadata
 * ------------------------------------------------------------------------- */
struct ingress_metadata_t {
    // which pass (PASS_*): PASS_FIRST for a worker's packet
    pass_type_t     pass_type;
    // 1 once the packet is dropped; action_code says why (or what happened)
    bit<1>          drop;
    action_code_t   action_code;

    // from the worker lookup (control plane, docs/protocol.md section 5)
    job_id_t        job_id;
    worker_id_t     worker_id;
    worker_bitmap_t worker_bit;       // 1 << worker_id
    num_workers_t   num_workers;
    count_t         count_start;      // num_workers - 1: missing after the first packet
    size_code_t     size_code;        // the size code the job registered
    value_formats_t value_formats;    // the value formats the job registered (section 5)
    slot_index_t    pool_base;        // the job's first slot entry
    pool_size_t     pool_size;        // the job's P
    MulticastGroupId_t mgid;

    // where the packet's (slot, set) lives
    pool_size_t     slot;             // the packet's slot (hdr.switchml.slot), 16 bits
    pool_size_t     slot_room;        // pool_size - slot, saturated at 0
    slot_index_t    slot_offset;      // slot (size code 3: 4 slot), the packet's offset in the pool
    slot_index_t    slot_index;       // pool_base + slot (size code 3: + 4 slot)
    pool_index_t    pool_index;       // slot_index ++ set (later passes: the pass's entry)
    value_op_t      value_op;         // later passes: switchml_md.value_op

    // section 2 state of this packet
    worker_bitmap_t worker_bitmap_before;  // the set's bitmap before this packet
    worker_bitmap_t map_result;            // before & worker_bit: != 0 <=> retransmission
    count_t         count;                 // workers still missing after this packet
}

struct egress_metadata_t {
}

#endif /* _TYPES_P4_ */
