// SPDX-License-Identifier: Apache-2.0
// The state of a per-process singleton that a forked child must not share.
// UCX and libfabric are not fork-safe: a forked child (a DataLoader worker)
// builds its own contexts and leaves its parent's alone (not destroyed: they
// share state with the parent). The UCX and libfabric consumers keep their
// instances here.
#pragma once

#include <unistd.h>

#include <mutex>

namespace dyad::dtl {

template <class T>
class PerProcess {
  public:
    // This process's state, under the singleton's lock; in a process that
    // has not used it yet (a forked child), a fresh T first.
    class Locked {
      public:
        T& operator*() { return state_; }
        T* operator->() { return &state_; }

      private:
        friend class PerProcess;
        Locked(std::mutex& mu, T& state) : lk_(mu), state_(state) {}
        std::unique_lock<std::mutex> lk_;
        T& state_;
    };

    Locked lock() {
        Locked l(mu_, state_);
        if (owner_ != ::getpid()) {
            state_ = T();
            owner_ = ::getpid();
        }
        return l;
    }

  private:
    std::mutex mu_;
    T state_{};
    pid_t owner_ = 0;
};

}  // namespace dyad::dtl
