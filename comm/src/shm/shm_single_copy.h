// The single-copy variants of the arena's large collectives: peers read each other's user
// buffers straight out of the owner's process (cross-memory attach, process_vm_readv; the
// arena's probe decided at setup whether every rank may: arena.h).
//
// How they work: one arena step per collective. Every rank publishes the addresses of its
// input and output buffers in its control block and posts; then
// - allreduce: rank r owns segment r of the buffer. It reads segment r of every peer's input
//   into a cache-sized bounce buffer, a chunk at a time, and reduces it into its own output
//   (its own operand comes straight from its input); marks it reduced; then reads every other
//   segment q out of rank q's output once q marked it reduced. Memory traffic per rank and
//   byte: (N-1)/N read across, one reduction pass over 1/N, (N-1)/N read across; the staged
//   path copies in, reduces, and copies all N segments out.
// - reduceScatter: rank r reads slice r of every peer's input through the bounce buffer and
//   reduces into its output.
// - broadcast: every non-root reads the root's buffer into its own.
// - allgather: every rank reads every peer's input into its slice of the output.
// Before returning, every rank waits until every peer finished the step (it no longer reads
// this rank's buffers), so the caller may reuse them at once. A failed read fails the group
// with an IoError naming the peer (Arena::readPeer); it never leaves a wrong result.
//
// Which path runs is decided per call from the byte count and the world size (useSingleCopy),
// identically on every rank. Measured on the 2-vCPU AMD EPYC dev VM (interleaved A/B rounds
// on a loaded machine, docs/results/2026-11-25-single-copy.md): process_vm_readv copies at
// 0.3-0.5x memcpy's rate there (it pins every page of both buffers), while the staged path's
// second copy reads a slot that is still in cache, so the staged path won at 2 ranks for every
// operation and size, and at 4 ranks for broadcast and all-reduce; only the 4-rank all-gather
// from 256 KiB to 4 MiB per rank was faster single-copy (1.7-2.5 against 0.06-0.2 GB/s: with
// more ranks than cores every staged step is a hand-over that waits for a descheduled rank).
// So under SingleCopy::kAuto only that cell takes it; kOn takes it everywhere (the sweeps'
// setting) and machines where the kernel copies faster can be measured with
// bench/peers/ab.sh "LOOM_SHM_SINGLE_COPY=on" against "...=off".
#pragma once

#include <cstddef>

#include "loom/comm/collectives.h"
#include "loom/comm/types.h"
#include "shm/arena.h"

namespace loom::comm::shm {

// Under ShmSingleCopy::kAuto: all-gathers of [kSingleCopyAllgatherMinBytes,
// kSingleCopyAllgatherMaxBytes] per rank on at least kSingleCopyAllgatherMinRanks ranks.
constexpr size_t kSingleCopyAllgatherMinBytes = size_t{256} << 10;
constexpr size_t kSingleCopyAllgatherMaxBytes = size_t{4} << 20;
constexpr int kSingleCopyAllgatherMinRanks = 3;

// Whether a collective of `kind` moving `bytes` per rank takes the single-copy path.
bool useSingleCopy(const Arena& arena, OpType kind, size_t bytes);

void singleCopyAllreduce(Arena& arena, const Arena::Call& call, const void* in, void* out,
                         size_t count, DType dtype, ReduceOp op);
void singleCopyReduceScatter(Arena& arena, const Arena::Call& call, const void* in, void* out,
                             size_t count, DType dtype, ReduceOp op);
void singleCopyBroadcast(Arena& arena, const Arena::Call& call, void* buf, size_t count,
                         DType dtype, int root);
void singleCopyAllgather(Arena& arena, const Arena::Call& call, const void* in, void* out,
                         size_t count, DType dtype);

}  // namespace loom::comm::shm
