// SPDX-License-Identifier: Apache-2.0
// The consumer side's chunk window, shared by the receivers that move a file
// chunk by chunk into a bounded memory window (UCX, libfabric), as
// ChunkedTransfer (chunked.hpp) is on the service side:
//   - a ring of slots: chunk k (numbered from 0 in file order) uses slot
//     k % slots; at most `depth` chunks move at once;
//   - moves are started ahead into free slots, complete in any order, and
//     are handed to the sink (or to a write-behind writer, which then holds
//     the slot until its write is done) in file order;
//   - each chunk handed over is acknowledged to the service (by the mover);
//   - an inactivity deadline, restarted by every chunk handed over and by
//     whatever the mover counts as progress;
//   - on any failure, every move in flight is cancelled before returning.
// A transport supplies a ChunkMover: how one chunk moves, how to wait, how
// to cancel. Everything else is here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/deadline.hpp"
#include "common/status.hpp"
#include "dtl.hpp"

namespace dyad::dtl {

class BackgroundWriter;

struct ChunkSlot {
    enum class State {
        free,    // nothing in it
        moving,  // a move was started (a receive posted, a read out, a put awaited)
        done,    // the move ended (result, got); not yet handed over
        held,    // with the write-behind writer until write `write_no` is done
    };
    size_t index = 0;     // in the ring
    uint64_t seq = 0;     // the chunk's number, from 0 in file order
    uint64_t offset = 0;  // of the chunk in the file
    size_t len = 0;       // bytes expected
    char* buf = nullptr;  // where the bytes land: the window's slot, or the mover's choice
    State state = State::free;
    Status result;          // of the move, once done
    size_t got = 0;         // bytes that arrived
    uint64_t write_no = 0;  // held: the writer's number for it
};

// The shape of one transfer's window.
struct WindowShape {
    uint64_t size = 0;         // the file's bytes
    size_t chunk = 0;          // bytes per chunk (the last may be shorter)
    size_t slots = 0;          // the ring
    size_t depth = 0;          // chunks moving at once (at most `slots`)
    char* memory = nullptr;    // slots * chunk bytes; null: the mover sets each slot's buf
    double idle_s = 60;        // seconds without progress before the transfer fails
    const char* what = "DTL";  // the transport, in messages
};

class ReceiveWindow;

// What one transport does with the window (each receiver keeps only this).
class ChunkMover {
  public:
    virtual ~ChunkMover() = default;
    // Starts moving chunk `s` (its seq, offset, len and buf are set).
    // `must`: nothing else is moving, so this may wait (within the window's
    // deadline) for what it needs; otherwise it takes only what is already
    // there. False: not now (the window waits, then asks again).
    [[nodiscard]] virtual Result<bool> start(ReceiveWindow& w, ChunkSlot& s, bool must) = 0;
    // Waits, within w.idle(), until a move completes (reported with
    // w.complete) or the service says something; an error ends the transfer.
    [[nodiscard]] virtual Status wait(ReceiveWindow& w) = 0;
    // Hands a completed chunk to the sink (default: sink.write of s.buf).
    [[nodiscard]] virtual Status deliver(ChunkSlot& s, Sink& sink);
    // Chunk `s` is handed over (w.received() counts it; with a writer, its
    // slot is held until written): acknowledge it to the service, and let go
    // of what its move held.
    [[nodiscard]] virtual Status handed_over(const ReceiveWindow& w, const ChunkSlot& s);
    // The END trailer, once every chunk is handed over (the channel's).
    [[nodiscard]] virtual Result<nlohmann::json> end(ReceiveWindow& w) = 0;

    // Failure: asks the move of `s` (started, not done) to stop; settle()
    // then makes cancelled moves end (one round, which may wait briefly),
    // for at most cancel_rounds() rounds and cancel_seconds(). cancelled()
    // follows, `clean` when no move is left.
    virtual void cancel(ChunkSlot& s) = 0;
    virtual void settle() = 0;
    virtual int cancel_rounds() const { return 1000; }
    virtual double cancel_seconds() const { return 2.0; }
    virtual void cancelled(ReceiveWindow& w, bool clean) {
        (void)w;
        (void)clean;
    }
};

class ReceiveWindow {
  public:
    explicit ReceiveWindow(WindowShape shape);
    ReceiveWindow(const ReceiveWindow&) = delete;
    ReceiveWindow& operator=(const ReceiveWindow&) = delete;

    // Moves the whole file into `sink` (through `writer` if given: then a
    // slot is reused only once its write is done) and returns the END
    // trailer. On failure every move in flight is cancelled first.
    [[nodiscard]] Result<nlohmann::json> run(ChunkMover& m, Sink& sink,
                                             BackgroundWriter* writer = nullptr);

    // For movers: a move ended (any order; once per started move).
    void complete(ChunkSlot& s, Status result, size_t got);
    // Something arrived: the inactivity clock restarts.
    void progressed() { idle_ = Deadline::after(shape_.idle_s); }

    const WindowShape& shape() const { return shape_; }
    const Deadline& idle() const { return idle_; }
    uint64_t size() const { return shape_.size; }
    uint64_t received() const { return received_; }    // bytes handed over
    uint64_t announced() const { return announced_; }  // bytes whose move started
    uint64_t delivered() const { return next_out_; }   // chunks handed over
    size_t moving() const { return moving_; }          // started, not handed over
    // The oldest chunk not handed over, or null.
    ChunkSlot* head();
    std::vector<ChunkSlot>& slots() { return slots_; }

  private:
    Status pump(ChunkMover& m, Sink& sink, BackgroundWriter* writer);
    Status fill(ChunkMover& m, BackgroundWriter* writer);
    Result<bool> hand_over(ChunkMover& m, Sink& sink, BackgroundWriter* writer);
    Status wait_for_writer(BackgroundWriter* writer);
    void cancel_all(ChunkMover& m);

    WindowShape shape_;
    std::vector<ChunkSlot> slots_;
    uint64_t announced_ = 0;
    uint64_t received_ = 0;
    uint64_t next_in_ = 0;   // the next chunk to start
    uint64_t next_out_ = 0;  // the next chunk to hand over
    size_t moving_ = 0;
    Deadline idle_;
};

}  // namespace dyad::dtl
