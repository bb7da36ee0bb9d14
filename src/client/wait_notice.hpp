// SPDX-License-Identifier: Apache-2.0
// Waits for a produce that the user can see, whatever the program: the
// CLI, the LD_PRELOAD wrapper, the C API, pydyad. While a WaitNotice lives,
// a wait longer than kFirstNotice seconds prints one line to stderr (even
// when it is no terminal) naming the file, the service and how long it has
// waited, again at growing intervals (5, 10, 20, 40 ... s, then every 10
// min). Once a wait has lasted that long, SIGTERM and SIGINT (when the
// program left them at their default) print a last line saying what was
// being waited for before the process dies of the signal as it would have.
// docs/user-guide.md, "Waiting you can see".
#pragma once

#include <string>

namespace dyad::client {

class WaitNotice {
  public:
    static constexpr double kFirstNotice = 5.0;   // seconds before the first line
    static constexpr double kLongestGap = 600.0;  // between two lines, at most

    // `what`: the file and the service, as the lines say it ("'a/b'
    // (/dir/a/b) to be produced, from service S on node N at URI");
    // `limit`: what ends the wait ("DYAD_WAIT_TIMEOUT=60 s", or "no limit
    // (DYAD_WAIT_TIMEOUT unset)").
    WaitNotice(const std::string& what, const std::string& limit);
    ~WaitNotice();
    WaitNotice(const WaitNotice&) = delete;
    WaitNotice& operator=(const WaitNotice&) = delete;

  private:
    int slot_ = -1;  // -1: too many waits at once to be shown (never more than kSlots)
};

}  // namespace dyad::client
