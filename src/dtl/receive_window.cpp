// SPDX-License-Identifier: Apache-2.0
#include "receive_window.hpp"

#include <algorithm>

#include "write_behind.hpp"

namespace dyad::dtl {

Status ChunkMover::deliver(ChunkSlot& s, Sink& sink) {
    return sink.write(s.buf, s.got);
}

Status ChunkMover::handed_over(const ReceiveWindow& w, const ChunkSlot& s) {
    (void)w;
    (void)s;
    return Status::ok();
}

ReceiveWindow::ReceiveWindow(WindowShape shape)
    : shape_(shape), slots_(std::max<size_t>(shape.slots, 1)) {
    shape_.slots = slots_.size();
    shape_.depth = std::clamp<size_t>(shape_.depth, 1, shape_.slots);
    for (size_t i = 0; i < slots_.size(); ++i) slots_[i].index = i;
    progressed();
}

ChunkSlot* ReceiveWindow::head() {
    if (moving_ == 0) return nullptr;
    return &slots_[next_out_ % slots_.size()];
}

void ReceiveWindow::complete(ChunkSlot& s, Status result, size_t got) {
    if (s.state != ChunkSlot::State::moving) return;  // not started, or reported twice
    s.state = ChunkSlot::State::done;
    s.result = std::move(result);
    s.got = got;
}

Result<nlohmann::json> ReceiveWindow::run(ChunkMover& m, Sink& sink, BackgroundWriter* writer) {
    Status st = pump(m, sink, writer);
    if (st && writer) st = writer->finish();
    if (!st) {
        cancel_all(m);
        return st;
    }
    return m.end(*this);
}

Status ReceiveWindow::pump(ChunkMover& m, Sink& sink, BackgroundWriter* writer) {
    while (received_ < shape_.size) {
        Status st = fill(m, writer);
        if (!st) return st;
        auto any = hand_over(m, sink, writer);
        if (!any) return any.status();
        if (any.value() || received_ >= shape_.size) continue;
        if (moving_ == 0) {
            st = wait_for_writer(writer);
            if (!st) return st;
            continue;
        }
        st = m.wait(*this);
        if (!st) return st;
    }
    return Status::ok();
}

// Starts moves into free slots, in ring order, up to the depth.
Status ReceiveWindow::fill(ChunkMover& m, BackgroundWriter* writer) {
    while (moving_ < shape_.depth && announced_ < shape_.size) {
        ChunkSlot& s = slots_[next_in_ % slots_.size()];
        // Slots are reused in turn: the next one may still be queued for the
        // writer, or (the ring is full) not yet handed over.
        if (s.state == ChunkSlot::State::held && writer && writer->written() > s.write_no)
            s.state = ChunkSlot::State::free;
        if (s.state != ChunkSlot::State::free) break;
        s.seq = next_in_;
        s.offset = announced_;
        s.len = static_cast<size_t>(std::min<uint64_t>(shape_.chunk, shape_.size - announced_));
        s.buf = shape_.memory ? shape_.memory + s.index * shape_.chunk : nullptr;
        s.result = Status::ok();
        s.got = 0;
        s.state = ChunkSlot::State::moving;
        auto started = m.start(*this, s, moving_ == 0);
        if (!started || !started.value()) {
            s.state = ChunkSlot::State::free;
            if (!started) return started.status();
            break;
        }
        announced_ += s.len;
        ++next_in_;
        ++moving_;
    }
    return Status::ok();
}

// Hands the oldest completed chunks over, in order; true if any was.
Result<bool> ReceiveWindow::hand_over(ChunkMover& m, Sink& sink, BackgroundWriter* writer) {
    bool any = false;
    for (ChunkSlot* s = head(); s && s->state == ChunkSlot::State::done; s = head()) {
        if (!s->result) return s->result;
        if (s->got != s->len)
            return Status(DYAD_RC_BADFETCH,
                          std::string(shape_.what) + " chunk of " + std::to_string(s->got) +
                              " bytes, expected " + std::to_string(s->len),
                          EIO);
        if (writer) {
            auto k = writer->submit(s->buf, s->got);
            if (!k) return k.status();
            s->write_no = k.value();
            s->state = ChunkSlot::State::held;
        } else {
            Status w = m.deliver(*s, sink);
            if (!w) return w;
            s->state = ChunkSlot::State::free;
        }
        received_ += s->got;
        ++next_out_;
        --moving_;
        progressed();
        Status a = m.handed_over(*this, *s);
        if (!a) return a;
        any = true;
    }
    return any;
}

// Nothing is moving: every free slot is with the writer. Its write is
// local, so this wait has no network deadline.
Status ReceiveWindow::wait_for_writer(BackgroundWriter* writer) {
    const ChunkSlot& next = slots_[next_in_ % slots_.size()];
    if (!writer || next.state != ChunkSlot::State::held)
        return Status(DYAD_RC_BADFETCH, std::string(shape_.what) + " receive ring stalled", EIO);
    return writer->wait_written(next.write_no + 1);
}

void ReceiveWindow::cancel_all(ChunkMover& m) {
    auto pending = [this] {
        for (const auto& s : slots_)
            if (s.state == ChunkSlot::State::moving) return true;
        return false;
    };
    for (auto& s : slots_)
        if (s.state == ChunkSlot::State::moving) m.cancel(s);
    Deadline d = Deadline::after(m.cancel_seconds());
    for (int i = 0; i < m.cancel_rounds() && pending() && !d.expired(); ++i) m.settle();
    m.cancelled(*this, !pending());
}

}  // namespace dyad::dtl
