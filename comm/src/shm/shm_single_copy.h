// The single-copy variants of the arena's large collectives: peers read each other's user
// buffers straight out of the owner's process (cross-memory attach, process_vm_readv; the
// arena's probe decided at setup whether every rank may: arena.h).
//
// How they work: one arena step per collective. Every rank publishes the addresses of its
// input and output buffers in its control block and posts; then
// - allreduce: rank r owns segment r of the buffer. It reads segment r of every peer's input
//   into a cache-sized bounce buffer, a block at a time, and folds them with its own operand
//   (straight from its input) in rank order into its own output (fold.h); marks it reduced; then
//   reads every other segment q out of rank q's output once q marked it reduced. Memory traffic per
//   rank and byte: (N-1)/N read across, one reduction pass over 1/N, (N-1)/N read across; the
//   staged path copies in, reduces, and copies all N segments out.
// - reduceScatter: rank r reads slice r of every peer's input through the bounce buffer and
//   reduces into its output.
// - broadcast: every non-root reads the root's buffer into its own.
// - allgather: every rank reads every peer's input into its slice of the output.
// Before returning, every rank waits until every peer finished the step (it no longer reads
// this rank's buffers), so the caller may reuse them at once. A failed read fails the group
// with an IoError naming the peer (Arena::readPeer); it never leaves a wrong result.
//
// Which path runs is decided per call (useSingleCopy), identically on every rank. Measured on
// the 2-vCPU AMD EPYC dev VM (interleaved A/B rounds, docs/results/2026-11-25-single-copy.md):
// process_vm_readv copies at 0.3-0.5x memcpy's rate there (it pins every page of both
// buffers), while the staged path's second copy reads a slot that is still in cache, so the
// staged path won or tied at 2 and 4 ranks for every operation and size. Under heavy load the
// 4-rank all-gather at 256 KiB-4 MiB was faster single-copy (one hand-over instead of one per
// chunk, with more ranks than cores), but on a quieter machine that cell was mixed (faster at
// 256 KiB and 4 MiB, slower at 1 MiB). So on this machine kind no size crossover was found and
// ShmSingleCopy::kAuto takes the staged path at every size (it still probes, so that the log
// says whether the path is available); kOn takes the single copy at every size (the sweeps'
// setting). A machine whose kernel copies faster (huge pages, bare metal) can be measured
// with bench/peers/ab.sh "...|LOOM_SHM_SINGLE_COPY=on" against "...|LOOM_SHM_SINGLE_COPY=off"
// and given a crossover here.
//
// Zero-copy windows (loom/comm/window.h) run the same algorithms with call.access kWindow:
// a peer's buffer is then read by plain loads from its mapped Window (Arena::peerWindow), and
// reductions read the peers' operands in place, with no bounce buffer. Two differ, because a
// window may be written too (Arena::peerWindowForWrite): the all-reduce is one pass, rank r
// writing each reduced chunk of segment r straight into segment r of every peer's output (no
// rank reads or writes another's segment, so in place is safe), and then waiting for every
// peer's "reduced" mark (all its writes into this rank's output done); and a broadcast's root
// may write part of each receiver's buffer (broadcastRootAssists). That path is taken
// whenever the buffers lie in Windows on every rank, from a measured size per operation (below
// it one staged step, a single hand-over, is cheaper than publishing buffers and waiting for
// every peer to finish reading).
#pragma once

#include <cstddef>

#include "loom/comm/collectives.h"
#include "loom/comm/types.h"
#include "shm/arena.h"
#include "shm/shm_collectives.h"
#include "shm/window_registry.h"

namespace loom::comm::shm {

// How the peers of a collective of `kind` moving `bytes` per rank reach its data, identically
// on every rank that passes alike buffers: kWindow when the buffers peers read (`read`, and
// `readToo` unless null) lie in Windows, the group's window probe passed and the collective's
// size (bytes, times the world size for all-gather and reduce-scatter) reaches the arena's
// windowMinBytes or, when that is 0, the measured default for `kind` (shm_single_copy.cc);
// kCrossMemory when single copy is usable and was forced on, or `bytes` lies in the tuning
// file's range for `kind` (Arena::crossMemoryFor); kStaged otherwise. `windows` receives the
// Windows that hold `read` and `readToo` on the window path.
PeerAccess choosePeerAccess(const Arena& arena, OpType kind, size_t bytes, const void* read,
                            size_t readBytes, const void* readToo, size_t readTooBytes,
                            WindowRef windows[2]);

// Whether the root of a window broadcast over `size` ranks, running on `cpus` CPUs, writes a
// segment of every receiver's buffer itself, so that every rank copies (size-1)/size of it
// (instead of each receiver copying it all while the root waits): when that lowers the
// busiest core's share. The root decides alone and posts its choice; receivers follow.
bool broadcastRootAssists(int size, int cpus);

// The single-copy collectives, for call.access kCrossMemory or kWindow (`windows` as
// choosePeerAccess filled it; unused for kCrossMemory).
void singleCopyAllreduce(Arena& arena, const Arena::Call& call, const WindowRef windows[2],
                         const void* in, void* out, size_t count, DType dtype, ReduceOp op);
void singleCopyReduceScatter(Arena& arena, const Arena::Call& call, const WindowRef windows[2],
                             const void* in, void* out, size_t count, DType dtype, ReduceOp op);
void singleCopyBroadcast(Arena& arena, const Arena::Call& call, const WindowRef windows[2],
                         void* buf, size_t count, DType dtype, int root);
void singleCopyAllgather(Arena& arena, const Arena::Call& call, const WindowRef windows[2],
                         const void* in, void* out, size_t count, DType dtype);
// The reduce over Windows (call.access kWindow: every rank's input in a Window). The root posts
// whether its output lies in one too. Then rank r folds segment r of every rank's input, read in
// place, in rank order (the staged path's bits), and writes it into segment r of the root's
// output, through the bounce buffer (so a reduce in place reads the root's operand before it
// is overwritten); otherwise the root folds the whole buffer alone. Every rank then waits until
// no peer reads its input. Only non-root ranks may pass a null output.
void windowReduce(Arena& arena, Arena::Call& call, WindowRef windows[2], const void* in, void* out,
                  size_t count, DType dtype, ReduceOp op, int root);
// allreduceRows (shm_collectives.h) over Windows (call.access kWindow): the window all-reduce's
// one pass with the n-ary reduction. Rank r reduces segment r a bounce buffer at a time,
// reading every peer's operand in place, and writes each result block into segment r of every
// rank's output; no rank reads or writes another's segment, so in place is safe, and the
// reducer's output (the bounce buffer) overlaps none of its operands.
void windowAllreduceRows(Arena& arena, const Arena::Call& call, const WindowRef windows[2],
                         const void* in, void* out, size_t count, DType dtype,
                         const RowsReducer& reduce);
// reduceRows (shm_collectives.h) over Windows: windowReduce's protocol with the n-ary
// reduction, each block reduced into the bounce buffer and copied into the root's output (or,
// when that lies outside any window, the root reducing the whole buffer alone).
void windowReduceRows(Arena& arena, Arena::Call& call, WindowRef windows[2], const void* in,
                      void* out, size_t count, DType dtype, int root, const RowsReducer& reduce);
// reduceScatterRows (shm_collectives.h) over Windows: rank r reduces slice r of every rank's
// input, read in place, into its output with the n-ary reduction, then waits until no peer
// reads its input any more. In place (the output is this rank's slice of the input) the slice is
// reduced a bounce buffer at a time, each block written after its operands were read.
void windowReduceScatterRows(Arena& arena, const Arena::Call& call, const WindowRef windows[2],
                             const void* in, void* out, size_t count, DType dtype,
                             const RowsReducer& reduce);

}  // namespace loom::comm::shm
