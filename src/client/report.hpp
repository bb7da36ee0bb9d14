// SPDX-License-Identifier: Apache-2.0
// What a consume says it did (Client::consume and every part of the client
// that moves a file's bytes fills it in).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace dyad::client {

// How far a transfer is, for a progress display.
struct TransferProgress {
    uint64_t bytes = 0;    // received so far
    uint64_t total = 0;    // the file's size
    double elapsed_s = 0;  // since the transfer started
};

// What a consume did (for the CLI, the demo and tests).
struct ConsumeReport {
    // In: if set, called on the consuming thread while a file's bytes
    // arrive: on the first bytes, then at most every progress_interval_s
    // (a clock read per received block, no system call).
    std::function<void(const TransferProgress&)> progress;
    double progress_interval_s = 0.25;
    // Out:
    std::string action;  // "fetched", "present", "in-place"
    std::string transport;
    std::string endpoint;
    uint64_t bytes = 0;
    double wait_s = 0;      // waiting for the file to be produced
    double transfer_s = 0;  // moving and storing its bytes
    std::string explain;    // DYAD_DTL_MODE=AUTO: why this transport (scores)
    // The same, as data (shared with the client's plan cache: a report is
    // per file, and copying the document for each was a tenth of the CPU of
    // a small file's consume).
    std::shared_ptr<const nlohmann::json> selection;
};

// A byte range of a file in memory (Client::consume_range). The bytes are
// malloc'd: the C API hands them to its caller, who frees them with free().
struct RangeBytes {
    std::unique_ptr<char, void (*)(void*)> data{nullptr, &std::free};
    size_t size = 0;
};

}  // namespace dyad::client
