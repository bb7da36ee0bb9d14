// SPDX-License-Identifier: Apache-2.0
// The transports' own messages: build and parse agree, lenient fields read
// as absent, and each refusal has the protocol's code, errno and message.
#include <gtest/gtest.h>

#include <cerrno>

#include "proto/transfer.hpp"

using namespace dyad::proto;
using nlohmann::json;

namespace {

// A JSON text as a peer sends it (non-negative numbers read as unsigned).
json wire(const char* text) {
    return json::parse(text);
}

void expect_refused(const dyad::Status& st, dyad_rc_t rc, int err, const std::string& msg) {
    EXPECT_EQ(st.rc(), rc);
    EXPECT_EQ(st.err(), err);
    EXPECT_EQ(st.message(), msg);
}

}  // namespace

// ---- UCX ----

TEST(ProtoTransfer, UcxRequestRoundTripsBesideTheFetchFields) {
    UcxRequest r;
    r.worker = "d29ya2Vy";
    r.tag = 42;
    r.consumer = "node/1/2";
    r.proto = "put";
    r.window = UcxRequest::Window{0x7f0000001000ull, 8u << 20, "cmtleQ=="};
    json a = {{"upath", "f"}, {"transport", "UCX"}};
    r.build_into(a);
    EXPECT_EQ(a["upath"], "f");
    auto p = UcxRequest::parse(wire(a.dump().c_str()));
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->worker, r.worker);
    EXPECT_EQ(p->tag, 42u);
    EXPECT_EQ(p->consumer, "node/1/2");
    EXPECT_EQ(p->proto, "put");
    ASSERT_TRUE(p->window);
    EXPECT_EQ(p->window->address, 0x7f0000001000ull);
    EXPECT_EQ(p->window->size, 8u << 20);
    EXPECT_EQ(p->window->rkey, "cmtleQ==");
    // The seven fields of the protocol, and only those with the fetch's.
    EXPECT_EQ(a.size(), 9u);
    for (const char* k : {"ucx_worker", "ucx_tag", "ucx_consumer", "ucx_proto", "ucx_rkey",
                          "ucx_window", "ucx_window_size"})
        EXPECT_TRUE(a.contains(k)) << k;
}

TEST(ProtoTransfer, UcxRequestRefusedWithoutWorkerOrTag) {
    const char* bad[] = {
        R"({"ucx_tag":1})",
        R"({"ucx_worker":"w"})",
        R"({"ucx_worker":7,"ucx_tag":1})",
        R"({"ucx_worker":"w","ucx_tag":-1})",
        R"({"ucx_worker":"w","ucx_tag":"1"})",
        R"({"ucx_worker":"w","ucx_tag":1.5})",
        R"([])",
    };
    for (const char* t : bad) {
        auto p = UcxRequest::parse(wire(t));
        ASSERT_FALSE(p.is_ok()) << t;
        expect_refused(p.status(), DYAD_RC_BADUNPACK, EINVAL,
                       "UCX fetch without ucx_worker and ucx_tag");
    }
    // A tag built as a signed integer is not the wire's unsigned one.
    EXPECT_FALSE(UcxRequest::parse(json{{"ucx_worker", "w"}, {"ucx_tag", 1}}).is_ok());
}

TEST(ProtoTransfer, UcxRequestDefaultsAndWindowAllOrNothing) {
    auto p = UcxRequest::parse(wire(R"({"ucx_worker":"w","ucx_tag":0,"ucx_proto":3,
        "ucx_consumer":null,"ucx_window":1,"ucx_window_size":2})"));
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->consumer, "?");
    EXPECT_EQ(p->proto, "auto");
    EXPECT_FALSE(p->window);  // no rkey: an older consumer
    p = UcxRequest::parse(wire(R"({"ucx_worker":"w","ucx_tag":0,"ucx_rkey":"k",
        "ucx_window":-1,"ucx_window_size":2})"));
    ASSERT_TRUE(p.is_ok());
    EXPECT_FALSE(p->window);
    json long_name = {
        {"ucx_worker", "w"}, {"ucx_tag", 0u}, {"ucx_consumer", std::string(500, 'n')}};
    p = UcxRequest::parse(long_name);
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->consumer.size(), UcxRequest::kMaxConsumer);
    // Without a window, build sends none of its fields.
    UcxRequest r;
    r.worker = "w";
    EXPECT_FALSE(r.build().contains("ucx_rkey"));
}

TEST(ProtoTransfer, UcxStartRoundTripsBothModes) {
    UcxStart tag{{100, "UCX"}, 1u << 20, std::nullopt};
    json t = tag.build();
    EXPECT_EQ(t, wire(R"({"size":100,"transport":"UCX","chunk":1048576})"));
    auto p = UcxStart::parse(t);
    ASSERT_TRUE(p.is_ok());
    EXPECT_FALSE(p->put());
    EXPECT_EQ(p->start.size, 100u);
    EXPECT_EQ(p->start.transport, "UCX");
    EXPECT_EQ(p->chunk, 1u << 20);

    UcxStart put{{5, "UCX"}, 4u << 20, "put"};
    json q = put.build();
    EXPECT_EQ(q, wire(R"({"size":5,"transport":"UCX","chunk":4194304,"mode":"put"})"));
    p = UcxStart::parse(q);
    ASSERT_TRUE(p.is_ok());
    EXPECT_TRUE(p->put());

    // Chunk and mode are lenient: of another type, absent.
    p = UcxStart::parse(wire(R"({"size":5,"chunk":"x","mode":1,"transport":2})"));
    ASSERT_TRUE(p.is_ok());
    EXPECT_FALSE(p->chunk);
    EXPECT_FALSE(p->put());
    EXPECT_EQ(p->start.transport, "");
}

TEST(ProtoTransfer, UcxStartRefusals) {
    for (const char* t : {R"({"chunk":1})", R"({"size":-1})", R"({"size":"1"})",
                          R"({"size":1,"chunk":0})", R"({"size":1,"chunk":67108865})"}) {
        auto p = UcxStart::parse(wire(t));
        ASSERT_FALSE(p.is_ok()) << t;
        expect_refused(p.status(), DYAD_RC_BADRPC, EPROTO,
                       std::string("bad first answer in a UCX fetch: ") + wire(t).dump());
    }
    EXPECT_TRUE(UcxStart::parse(wire(R"({"size":1,"chunk":67108864})")).is_ok());
}

TEST(ProtoTransfer, UcxPutNoticeRoundTripsAndRefusals) {
    json n = UcxPutNotice{3, 4096}.build();
    EXPECT_EQ(n, wire(R"({"slot":3,"len":4096})"));
    auto p = UcxPutNotice::parse(n);
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->slot, 3u);
    EXPECT_EQ(p->len, 4096u);
    auto bad = UcxPutNotice::parse(wire(R"({"len":1})"));
    ASSERT_FALSE(bad.is_ok());
    expect_refused(bad.status(), DYAD_RC_BADFETCH, EPROTO,
                   R"(UCX put notice {"len":1}: field 'slot' missing)");
    bad = UcxPutNotice::parse(wire(R"({"slot":1,"len":-2})"));
    ASSERT_FALSE(bad.is_ok());
    expect_refused(bad.status(), DYAD_RC_BADFETCH, EPROTO,
                   R"(UCX put notice {"len":-2,"slot":1}: field 'len' missing)");
}

TEST(ProtoTransfer, UcxAckCarriesTheCreditOfTheFirstRelease) {
    json a = UcxAck::of(9).build();
    EXPECT_EQ(a, wire(R"({"ack":9,"credit":1})"));
    auto p = UcxAck::parse(a);
    EXPECT_EQ(p.ack, 9u);
    EXPECT_FALSE(p.oldest());
    EXPECT_EQ(ChunkAck::seq_of(a), 9u);
    EXPECT_TRUE(UcxAck::parse(wire(R"({"credit":1})")).oldest());
    EXPECT_FALSE(UcxAck::parse(wire(R"({"credit":2})")).oldest());
    EXPECT_TRUE(UcxAck::parse(wire(R"({"ack":"x","credit":1})")).oldest());
    EXPECT_EQ((UcxAck{std::nullopt, 1}.build()), wire(R"({"credit":1})"));
}

// ---- MARGO ----

TEST(ProtoTransfer, OfiRequestRoundTripsAndRefusal) {
    json a = {{"upath", "f"}};
    OfiRequest{"ofi+tcp"}.build_into(a);
    EXPECT_EQ(a, wire(R"({"upath":"f","ofi_proto":"ofi+tcp"})"));
    auto p = OfiRequest::parse(a);
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->proto, "ofi+tcp");
    EXPECT_EQ(OfiRequest{"ofi+shm"}.build(), wire(R"({"ofi_proto":"ofi+shm"})"));
    for (const char* t : {R"({})", R"({"ofi_proto":1})", R"({"ofi_proto":null})"}) {
        auto bad = OfiRequest::parse(wire(t));
        ASSERT_FALSE(bad.is_ok()) << t;
        expect_refused(bad.status(), DYAD_RC_BADUNPACK, EINVAL, "OFI fetch without ofi_proto");
    }
}

TEST(ProtoTransfer, OfiStartRoundTripsAndRefusal) {
    OfiStart s{{7, "MARGO"}, 1u << 20, "ofi+tcp", "YWRkcg=="};
    json j = s.build();
    EXPECT_EQ(j, wire(R"({"size":7,"transport":"MARGO","chunk":1048576,"proto":"ofi+tcp",
                          "ofi_addr":"YWRkcg=="})"));
    auto p = OfiStart::parse(j);
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->start.size, 7u);
    EXPECT_EQ(p->chunk, 1u << 20);
    EXPECT_EQ(p->proto, "ofi+tcp");
    EXPECT_EQ(p->address, "YWRkcg==");
    p = OfiStart::parse(wire(R"({"size":0,"chunk":-1,"ofi_addr":5})"));
    ASSERT_TRUE(p.is_ok());
    EXPECT_FALSE(p->chunk);
    EXPECT_EQ(p->address, "");
    for (const char* t : {R"({"chunk":1})", R"({"size":-3})"}) {
        auto bad = OfiStart::parse(wire(t));
        ASSERT_FALSE(bad.is_ok()) << t;
        expect_refused(bad.status(), DYAD_RC_BADRPC, EPROTO,
                       std::string("bad first answer in an OFI fetch: ") + wire(t).dump());
    }
}

TEST(ProtoTransfer, OfiChunkRoundTripsAndDefaults) {
    json c = OfiChunk{2, 0x1000, 77, 512}.build();
    EXPECT_EQ(c, wire(R"({"seq":2,"addr":4096,"key":77,"len":512})"));
    auto p = OfiChunk::parse(c);
    EXPECT_EQ(p.seq, 2u);
    EXPECT_EQ(p.addr, 0x1000u);
    EXPECT_EQ(p.key, 77u);
    EXPECT_EQ(p.len, 512u);
    auto d = OfiChunk::parse(wire(R"({"seq":"2","addr":-1})"));
    EXPECT_EQ(d.seq, ~0ull);
    EXPECT_EQ(d.addr, 0u);
    EXPECT_EQ(d.key, 0u);
    EXPECT_EQ(d.len, 0u);
}

TEST(ProtoTransfer, ChunkAckRoundTrips) {
    json a = ChunkAck{5}.build();
    EXPECT_EQ(a, wire(R"({"ack":5})"));
    EXPECT_EQ(ChunkAck::seq_of(a), 5u);
    EXPECT_FALSE(ChunkAck::seq_of(wire(R"({"ack":"5"})")));
    EXPECT_FALSE(ChunkAck::seq_of(wire(R"({"ack":-5})")));
    EXPECT_FALSE(ChunkAck::seq_of(wire(R"([5])")));
}

// ---- LOCAL ----

TEST(ProtoTransfer, LocalCopiedRoundTripsAndRefusal) {
    json c = LocalCopied{123}.build();
    EXPECT_EQ(c, wire(R"({"copied":123})"));
    auto p = LocalCopied::parse(c);
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->copied, 123u);
    for (const char* t : {R"({})", R"({"copied":"1"})", R"({"copied":-1})"}) {
        auto bad = LocalCopied::parse(wire(t));
        ASSERT_FALSE(bad.is_ok()) << t;
        expect_refused(bad.status(), DYAD_RC_BADRPC, EPROTO, "LOCAL update without 'copied'");
    }
}

TEST(ProtoTransfer, StartSizeIsLenient) {
    EXPECT_EQ(start_size(FetchStart{9, "LOCAL"}.build()), 9u);
    EXPECT_FALSE(start_size(wire(R"({"size":"9"})")));
    EXPECT_FALSE(start_size(wire(R"({"size":-9})")));
    EXPECT_FALSE(start_size(wire(R"({})")));
}

// ---- The AUTO selector's records ----

TEST(ProtoTransfer, TransportRecordRoundTripsAndRefusals) {
    TransportRecord r;
    r.name = "UCX";
    r.reach = kReachHost;
    r.latency_us = 20;
    r.bandwidth_gbps = 10.5;
    r.rma_native = true;
    r.max_message = 1u << 20;
    r.address = "a";
    r.detail = "rc_mlx5";
    r.source = "measured";
    auto p = TransportRecord::parse(wire(r.build().dump().c_str()));
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->build(), r.build());
    EXPECT_EQ(r.build().size(), 9u);
    auto d = TransportRecord::parse(wire(R"({"name":"FLUX_RPC"})"));
    ASSERT_TRUE(d.is_ok());
    EXPECT_EQ(d->reach, kReachNetwork);
    EXPECT_EQ(d->bandwidth_gbps, 0.0);
    for (const char* t : {R"({})", R"({"name":1})", R"([])"}) {
        auto bad = TransportRecord::parse(wire(t));
        ASSERT_FALSE(bad.is_ok()) << t;
        expect_refused(bad.status(), DYAD_RC_BADMETADATA, EPROTO,
                       "transport record without a name");
    }
    auto bad = TransportRecord::parse(wire(R"({"name":"UCX","latency_us":"fast"})"));
    ASSERT_FALSE(bad.is_ok());
    EXPECT_EQ(bad.status().rc(), DYAD_RC_BADMETADATA);
    EXPECT_EQ(bad.status().err(), EPROTO);
    EXPECT_EQ(bad.status().message().rfind("malformed transport record: ", 0), 0u);
}
