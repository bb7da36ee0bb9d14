// SPDX-License-Identifier: Apache-2.0
// What the client's trace events (common/trace.hpp) say about a file: the
// arguments of produce, publish, lookup / wait-for-create, transfer, commit
// and consume. Called only when the span is active (tracing on).
#pragma once

#include <string>

#include "report.hpp"
#include "common/status.hpp"
#include "common/trace.hpp"
#include "proto/publish.hpp"
#include "record.hpp"

namespace dyad::client {

inline void trace_record(trace::Span& sp, const Record& rec, const std::string& key) {
    sp.arg("path", rec.upath)
        .arg("key", key)
        .arg("size", rec.size)
        .arg("generation", rec.generation)
        .arg("owner", rec.owner);
}

inline void trace_transfer(trace::Span& sp, const Record& rec, const std::string& key,
                           const std::string& transport, uint64_t bytes, const Status& s) {
    trace_record(sp, rec, key);
    sp.arg("transport", transport).arg("bytes", bytes).fail(s);
    sp.finish();  // the commit that follows is an event of its own
}

inline void trace_commit(trace::Span& sp, const Record& rec, const std::string& key, uint64_t bytes,
                         const Status& s) {
    trace_record(sp, rec, key);
    sp.arg("bytes", bytes).fail(s);
}

// The publish request's answer: the key, the generation and the record.
inline void trace_produced(trace::Span& sp, const std::string& upath,
                           const proto::PublishAnswer& a) {
    sp.arg("path", upath).arg("key", a.key).arg("generation", a.version);
    auto size = a.record.find("size");
    if (size != a.record.end() && size->is_number_unsigned()) sp.arg("size", size->get<uint64_t>());
}

inline void trace_publish(trace::Span& sp, const std::string& upath,
                          const Result<nlohmann::json>& answer) {
    sp.fail(answer.status());
    if (!answer) {
        sp.arg("path", upath);
        return;
    }
    auto a = proto::PublishAnswer::parse(answer.value());
    if (a) trace_produced(sp, upath, a.value());
}

inline void trace_consume(trace::Span& sp, const std::string& path, const ConsumeReport& rep,
                          const Status& s) {
    sp.arg("path", path)
        .arg("action", rep.action)
        .arg("transport", rep.transport)
        .arg("bytes", rep.bytes)
        .fail(s);
}

}  // namespace dyad::client
