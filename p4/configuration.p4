/*
 * configuration.p4 -- sizes and protocol constants of the SwitchML program.
 *
 * Every constant says why it has its value. Those that mirror the Python side
 * (swemu/protocol/wire.py) are checked against it by tests/test_p4_headers.py, so the
 * emulator and this program cannot drift apart silently.
 *
 * Widths that appear inside a type (bit<...>) are preprocessor macros: P4_16
 * type widths must be known while the program is parsed.
 */

#ifndef _CONFIGURATION_P4_
#define _CONFIGURATION_P4_

/* ---------------------------------------------------------------------------
 * Protocol (docs/protocol.md section 1) -- mirrored in swemu/protocol/wire.py
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

// Values one pass through the pipe aggregates: 64 x int32 = 256 bytes, a whole
// size-code-1 packet (wire.values_per_packet(1)) and a quarter of a size-code-3
// one. 32 register pairs hold them (aggregate.p4), two 32-value halves of the
// packet (value_half_h).
#define VALUES_PER_PASS 64
#define VALUES_PER_HALF 32

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
const bit<16> UDP_LENGTH_CODE3 = 8 + 10 + 4 * 256;    // 1042: this program, 4 passes
const bit<16> UDP_LENGTH_CODE4 = 8 + 10 + 4 * 512;    // 2066: emulator extension
const bit<16> UDP_LENGTH_CODE5 = 8 + 10 + 4 * 1024;   // 4114: emulator extension
const bit<16> UDP_LENGTH_CODE6 = 8 + 10 + 4 * 2048;   // 8210: emulator extension
const bit<16> UDP_LENGTH_CODE7 = 8 + 10 + 4 * 4096;   // 16402: emulator extension

// The size codes this program aggregates (wire.HARDWARE_SIZE_CODES, the two that
// p4app-switchML's hosts send). Code 1 in one pass (plus a harvest pass for a
// result); code 3 in four passes of 64 values, each the next quarter of the
// packet's values in the next quarter of the slot's register entries.
const bit<3> SIZE_CODE_ONE_PASS = 1;
const bit<3> SIZE_CODE_FOUR_PASSES = 3;
#define QUARTERS 4

/* ---------------------------------------------------------------------------
 * Switch resources (Tofino 1)
 * ------------------------------------------------------------------------- */

// Slot entries of all jobs together, per shadow set. Jobs get disjoint ranges
// from the control plane: a size-code-1 job's slot is one entry, a size-code-3
// job's slot four consecutive entries (one per quarter of its 256 values), so
// a job of P slots takes [pool_base, pool_base + P) or [pool_base, pool_base + 4P).
// A value register holds one 2 x 32-bit pair per (entry, set): 2 x 8192
// entries x 64 bit = 8 SRAM blocks of 1024 x 128 bit, plus one spare block
// the stateful ALU needs, i.e. 9 blocks. Four such registers fill a stage's
// four stateful ALUs with 36 of its 80 SRAM blocks, which leaves room for the
// map RAMs the registers need. A job may use at most this many slots on
// hardware at size code 1 and a quarter of it at size code 3 (the emulator
// allows 16384 per job).
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
// pipe's recirculation port. Every later pass of a packet goes through the
// recirculation port of the pipe it came in on, because the registers live in
// that pipe; one port is one FIFO queue, so the k-th passes of two packets
// reach the registers in the order of their first passes (passes.p4).
const bit<7> RECIRCULATION_PORT_IN_PIPE = 68;

/* ---------------------------------------------------------------------------
 * Passes (switchml_md.pass_type): which trip through the pipe a packet is on.
 * passes.p4 chains them; its next_pass table is the list below.
 * ------------------------------------------------------------------------- */
// A worker's packet, from a front-panel port: checks, bitmap, count, exponents,
// and the first 64 values (size code 1: all; size code 3: values 0..63).
const bit<4> PASS_FIRST = 0;
// Size code 1, a result: read the second halves of the pairs (values 32..63), send.
const bit<4> PASS_HARVEST = 1;
// Size code 3: add values 64..127, 128..191, 192..255 (quarters 1, 2, 3).
const bit<4> PASS_CONSUME1 = 2;
const bit<4> PASS_CONSUME2 = 3;
const bit<4> PASS_CONSUME3 = 4;
// Size code 3, a result: the deparser can only put headers in front of the
// payload, so the result is collected back to front, 32 values a pass (one
// half of each of the 32 register pairs): quarter 3's second halves (values
// 224..255) first, quarter 0's first halves (values 0..31) last, then sent.
const bit<4> PASS_COLLECT_3_SECOND = 5;
const bit<4> PASS_COLLECT_3_FIRST = 6;
const bit<4> PASS_COLLECT_2_SECOND = 7;
const bit<4> PASS_COLLECT_2_FIRST = 8;
const bit<4> PASS_COLLECT_1_SECOND = 9;
const bit<4> PASS_COLLECT_1_FIRST = 10;
const bit<4> PASS_COLLECT_0_SECOND = 11;
const bit<4> PASS_COLLECT_0_FIRST = 12;

// The value formats a job registers (docs/protocol.md section 5, ValueFormats;
// swemu.protocol.wire.ValueFormats). A 16-bit packet (byte 0's format bit, the
// header's "unused" bit, set) carries 2N 16-bit values, two to each 32-bit word,
// bounded by the workers so that no lane's sum carries into the next
// (section 4.2): the value registers add its words as they add int32 values, so
// the format costs no register, no stateful ALU and no pass. The switch's only
// part is the format bit of a result: the triggering packet's for a job of
// VALUE_FORMATS_INT32_AND_BLOCK16, 0 (as p4app-switchML) for the others.
const bit<1> VALUE_FORMATS_INT32 = 0;
const bit<1> VALUE_FORMATS_INT32_AND_BLOCK16 = 1;

// What the first pass decided for the value registers (section 2 step 4),
// carried to the consume passes of a size-code-3 packet.
const bit<2> VALUE_OP_WRITE = 1;   // the set was released: overwrite
const bit<2> VALUE_OP_ADD = 2;     // a new contribution
const bit<2> VALUE_OP_READ = 3;    // a retransmission: nothing changes

/* ---------------------------------------------------------------------------
 * What the switch did with a packet (the per-job counter's second index).
 * Same numbering as swemu.core.engine.Action / swemu.core.kernels.A_*.
 * ------------------------------------------------------------------------- */
const bit<3> ACTION_DROP_UNKNOWN_SOURCE = 0;
const bit<3> ACTION_DROP_MALFORMED = 1;
const bit<3> ACTION_DROP_WRONG_SIZE = 2;
const bit<3> ACTION_DROP_SLOT_RANGE = 3;
const bit<3> ACTION_AGGREGATED = 4;
const bit<3> ACTION_MULTICAST = 5;
const bit<3> ACTION_RETRANSMIT_PENDING = 6;
const bit<3> ACTION_UNICAST = 7;

#ifdef P4TESTGEN
/* ---------------------------------------------------------------------------
 * P4Testgen only: p4/testgen/generate.py defines P4TESTGEN; bf-p4c and p4test
 * never see this. Its path constraint (P4Testgen's p4include/testgen.p4),
 * with which the program states what its control plane writes and what its
 * recirculation port carries (worker_lookup.p4, parsers.p4).
 * ------------------------------------------------------------------------- */
extern void testgen_assume(in bool check);
#endif

#endif /* _CONFIGURATION_P4_ */
