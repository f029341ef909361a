/*
 * configuration.p4 -- sizes and protocol constants of the SwitchML program.
 *
 * Every constant says why it has its value. Those that mirror the Python side
 * (swemu/wire.py) are checked against it by tests/test_p4_headers.py, so the
 * emulator and this program cannot drift apart silently.
 *
 * Widths that appear inside a type (bit<...>) are preprocessor macros: P4_16
 * type widths must be known while the program is parsed.
 */

#ifndef _CONFIGURATION_P4_
#define _CONFIGURATION_P4_

/* ---------------------------------------------------------------------------
 * Protocol (PROTOCOL.md section 1) -- mirrored in swemu/wire.py
 * ------------------------------------------------------------------------- */

// msg_type of every packet a worker sends and the switch sends (wire.MSG_TYPE).
const bit<4> MSG_TYPE_SWITCHML = 1;

// The switch owns the UDP ports 0xBEE0..0xBEEF: it matches
// dst_port & 0xFFF0 == 0xBEE0 (wire.UDP_PORT_BASE / wire.UDP_PORT_MASK).
const bit<16> SWITCHML_UDP_PORT_BASE = 0xBEE0;
const bit<16> SWITCHML_UDP_PORT_MASK = 0xFFF0;

// pool_index bits 13..0 carry the slot, so a job has at most 2^14 slots
// (wire.MAX_SLOTS == 1 << SLOT_INDEX_BITS).
#define SLOT_INDEX_BITS 14

// One bit per worker in a 32-bit bitmap: a job has at most 32 workers
// (wire.MAX_WORKERS). A stateful ALU works on 32-bit words, so 32 is also the
// widest bitmap one register access can update.
#define MAX_WORKERS 32
#define WORKER_ID_BITS 5

// Values per packet of the size code this program aggregates: 64 x int32 =
// 256 bytes (size code 1, wire.values_per_packet(1)).
#define VALUES_PER_PACKET 64

// SwitchML header length in bytes (wire.HEADER_LEN).
#define SWITCHML_HEADER_BYTES 10

// UDP length (8-byte UDP header + 10-byte SwitchML header + 4N value bytes)
// of a well-formed packet of each size code, N = 32 << code. A datagram whose
// length is not the one of its size code is malformed (section 1). On the wire
// Ethernet pads short frames, so the UDP length field -- not the frame length --
// is what tells a short datagram apart.
const bit<16> UDP_LENGTH_CODE0 = 8 + 10 + 4 * 32;     // 146: emulator only
const bit<16> UDP_LENGTH_CODE1 = 8 + 10 + 4 * 64;     // 274: this program
const bit<16> UDP_LENGTH_CODE2 = 8 + 10 + 4 * 128;    // 530: emulator only
const bit<16> UDP_LENGTH_CODE3 = 8 + 10 + 4 * 256;    // 1042: see README (not here)
const bit<16> UDP_LENGTH_CODE4 = 8 + 10 + 4 * 512;    // 2066: emulator extension
const bit<16> UDP_LENGTH_CODE5 = 8 + 10 + 4 * 1024;   // 4114: emulator extension
const bit<16> UDP_LENGTH_CODE6 = 8 + 10 + 4 * 2048;   // 8210: emulator extension
const bit<16> UDP_LENGTH_CODE7 = 8 + 10 + 4 * 4096;   // 16402: emulator extension

// The only size code this program aggregates.
const bit<3> SIZE_CODE_SUPPORTED = 1;

/* ---------------------------------------------------------------------------
 * Switch resources (Tofino 1)
 * ------------------------------------------------------------------------- */

// Slots of all jobs together, per shadow set. Jobs get disjoint ranges
// [pool_base, pool_base + pool_size) from the control plane.
// A value register holds one 2 x 32-bit pair per (slot, set): 2 x 8192
// entries x 64 bit = 8 SRAM blocks of 1024 x 128 bit, plus one spare block
// the stateful ALU needs, i.e. 9 blocks. Four such registers fill a stage's
// four stateful ALUs with 36 of its 80 SRAM blocks, which leaves room for the
// map RAMs the registers need. A job may use at most this many slots on
// hardware (the emulator allows 16384 per job).
#define NUM_POOL_SLOTS 8192
#define POOL_SLOT_BITS 13
// (slot, set) entries: a slot index with the set appended as the lowest bit.
#define POOL_INDEX_BITS 14

// Job ids index the per-job counters (job_id ++ action code). 0 means "no
// job" (unknown source), so 255 jobs can be programmed -- more than the 8192
// slots can hold with any useful pool size.
#define JOB_ID_BITS 8

// Worker addresses: one exact-match entry per registered worker. 32 jobs of
// 32 workers cost 1024 entries of a 48-bit key, a fraction of one stage's
// SRAM; the egress table of worker addresses (keyed by replication id) has
// the same size for the same reason.
#define MAX_WORKER_ENTRIES 1024

// Per-job counters: index = job_id (8 bits) ++ action code (3 bits).
#define COUNTER_INDEX_BITS 11
const bit<32> COUNTER_SIZE = 2048;

// On Tofino 1, port 68 of every pipe (device port pipe << 7 | 68) is the
// pipe's recirculation port. A result is harvested by one more pass through
// the same pipe, because the registers live in that pipe.
const bit<7> RECIRCULATION_PORT_IN_PIPE = 68;

/* ---------------------------------------------------------------------------
 * What the switch did with a packet (the per-job counter's second index).
 * Same numbering as swemu.engine.Action / swemu.kernels.A_*.
 * ------------------------------------------------------------------------- */
const bit<3> ACTION_DROP_UNKNOWN_SOURCE = 0;
const bit<3> ACTION_DROP_MALFORMED = 1;
const bit<3> ACTION_DROP_WRONG_SIZE = 2;
const bit<3> ACTION_DROP_SLOT_RANGE = 3;
const bit<3> ACTION_AGGREGATED = 4;
const bit<3> ACTION_MULTICAST = 5;
const bit<3> ACTION_RETRANSMIT_PENDING = 6;
const bit<3> ACTION_UNICAST = 7;

#endif /* _CONFIGURATION_P4_ */
