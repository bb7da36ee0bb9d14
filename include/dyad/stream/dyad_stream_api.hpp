// SPDX-License-Identifier: Apache-2.0
// C++ file streams that go through DYAD: opening for reading consumes the
// file first (waits until it is produced, then fetches it); closing a stream
// opened for writing produces (publishes) it. Each stream is a std file
// stream (get_stream() returns it as one) with a dyad::dyad_stream_core
// (<dyad/stream/dyad_stream_core.hpp>, in libdyad.so) doing the DYAD side;
// configuration comes from the same DYAD_* environment as everything else,
// or from a core initialised with dyad_params and given to the stream.
// C++11 or later.
//
// Errors: a failed consume or produce sets failbit; dyad_rc() and
// dyad_error() say what happened. No exception is thrown unless the stream's
// exceptions() mask asks for it.
//
// Names: dyad::ifstream, dyad::ofstream, dyad::fstream (and w- variants), and
// DYAD's ifstream_dyad, ofstream_dyad, fstream_dyad, wifstream_dyad, ...
#ifndef DYAD_STREAM_DYAD_STREAM_API_HPP
#define DYAD_STREAM_DYAD_STREAM_API_HPP

#if defined(DYAD_HAS_CONFIG)
#include <dyad/dyad_config.hpp>
#endif

#include <fstream>
#include <string>
#include <utility>

#include <dyad/client/dyad_client.h>
#include <dyad/core/dyad_ctx.h>
#include <dyad/stream/dyad_stream_core.hpp>

namespace dyad {

namespace detail {

// Closes `base` (the std stream of `stream`) and publishes `path` unless it
// is empty (not opened for writing) or a write failed; a failed publish sets
// failbit.
template <typename Stream, typename Base>
void close_and_publish(Stream& stream, Base& base, dyad_stream_core& core, std::string& path) {
    if (!stream.is_open()) return;
    base.close();
    std::string p;
    p.swap(path);
    if (p.empty() || stream.fail()) return;  // never publish a failed write
    if (!core.close_sync(p.c_str())) stream.setstate(std::ios_base::failbit);
}

}  // namespace detail

template <typename CharT, typename Traits = std::char_traits<CharT> >
class basic_ifstream_dyad : public std::basic_ifstream<CharT, Traits> {
    typedef std::basic_ifstream<CharT, Traits> base;

  public:
    basic_ifstream_dyad() {}
    // Uses `core` (initialised or not) for DYAD instead of the environment's.
    explicit basic_ifstream_dyad(const dyad_stream_core& core) : core_(core) {}
    explicit basic_ifstream_dyad(const std::string& path,
                                 std::ios_base::openmode mode = std::ios_base::in) {
        open(path, mode);
    }
    explicit basic_ifstream_dyad(const char* path,
                                 std::ios_base::openmode mode = std::ios_base::in) {
        open(std::string(path), mode);
    }
    basic_ifstream_dyad(basic_ifstream_dyad&& o) : base(std::move(o)), core_(std::move(o.core_)) {}
    basic_ifstream_dyad& operator=(basic_ifstream_dyad&& o) {
        base::operator=(std::move(o));
        core_ = std::move(o.core_);
        return *this;
    }
    void swap(basic_ifstream_dyad& o) {
        base::swap(o);
        std::swap(core_, o.core_);
    }

    void open(const std::string& path, std::ios_base::openmode mode = std::ios_base::in) {
        if (!core_.open_sync(path.c_str())) {
            this->setstate(std::ios_base::failbit);
            return;
        }
        base::open(path, mode);
    }
    void open(const char* path, std::ios_base::openmode mode = std::ios_base::in) {
        open(std::string(path), mode);
    }

    // The std stream (this object as one).
    base& get_stream() { return *this; }
    const base& get_stream() const { return *this; }
    // Replaces this stream's core with `core`, which counts as initialised.
    void init(const dyad_stream_core& core) {
        core_ = core;
        core_.set_initialized();
        core_.log_info("Stream core state is set");
    }
    const dyad_stream_core& core() const { return core_; }

    dyad_rc_t dyad_rc() const { return core_.dyad_rc(); }
    const std::string& dyad_error() const { return core_.dyad_error(); }

  private:
    dyad_stream_core core_;
};

template <typename CharT, typename Traits = std::char_traits<CharT> >
class basic_ofstream_dyad : public std::basic_ofstream<CharT, Traits> {
    typedef std::basic_ofstream<CharT, Traits> base;

  public:
    basic_ofstream_dyad() {}
    explicit basic_ofstream_dyad(const dyad_stream_core& core) : core_(core) {}
    explicit basic_ofstream_dyad(const std::string& path,
                                 std::ios_base::openmode mode = std::ios_base::out) {
        open(path, mode);
    }
    explicit basic_ofstream_dyad(const char* path,
                                 std::ios_base::openmode mode = std::ios_base::out) {
        open(std::string(path), mode);
    }
    basic_ofstream_dyad(basic_ofstream_dyad&& o)
        : base(std::move(o)), core_(std::move(o.core_)), path_(std::move(o.path_)) {
        o.path_.clear();
    }
    // Closes (and publishes) this stream's file first.
    basic_ofstream_dyad& operator=(basic_ofstream_dyad&& o) {
        if (this == &o) return *this;
        close();
        base::operator=(std::move(o));
        core_ = std::move(o.core_);
        path_ = std::move(o.path_);
        o.path_.clear();
        return *this;
    }
    void swap(basic_ofstream_dyad& o) {
        base::swap(o);
        std::swap(core_, o.core_);
        path_.swap(o.path_);
    }
    ~basic_ofstream_dyad() override {
        if (this->is_open()) close();
    }

    void open(const std::string& path, std::ios_base::openmode mode = std::ios_base::out) {
        base::open(path, mode);
        if (this->is_open()) path_ = path;
    }
    void open(const char* path, std::ios_base::openmode mode = std::ios_base::out) {
        open(std::string(path), mode);
    }
    // Closes, then publishes the file if it lies in the producer directory.
    void close() { detail::close_and_publish(*this, static_cast<base&>(*this), core_, path_); }

    // The std stream (this object as one). Closing it there does not publish.
    base& get_stream() { return *this; }
    const base& get_stream() const { return *this; }
    void init(const dyad_stream_core& core) {
        core_ = core;
        core_.set_initialized();
        core_.log_info("Stream core state is set");
    }
    const dyad_stream_core& core() const { return core_; }

    dyad_rc_t dyad_rc() const { return core_.dyad_rc(); }
    const std::string& dyad_error() const { return core_.dyad_error(); }

  private:
    dyad_stream_core core_;
    std::string path_;
};

template <typename CharT, typename Traits = std::char_traits<CharT> >
class basic_fstream_dyad : public std::basic_fstream<CharT, Traits> {
    typedef std::basic_fstream<CharT, Traits> base;

  public:
    basic_fstream_dyad() {}
    explicit basic_fstream_dyad(const dyad_stream_core& core) : core_(core) {}
    explicit basic_fstream_dyad(const std::string& path,
                                std::ios_base::openmode mode = std::ios_base::in |
                                                               std::ios_base::out) {
        open(path, mode);
    }
    explicit basic_fstream_dyad(const char* path,
                                std::ios_base::openmode mode = std::ios_base::in |
                                                               std::ios_base::out) {
        open(std::string(path), mode);
    }
    basic_fstream_dyad(basic_fstream_dyad&& o)
        : base(std::move(o)), core_(std::move(o.core_)), path_(std::move(o.path_)) {
        o.path_.clear();
    }
    basic_fstream_dyad& operator=(basic_fstream_dyad&& o) {
        if (this == &o) return *this;
        close();
        base::operator=(std::move(o));
        core_ = std::move(o.core_);
        path_ = std::move(o.path_);
        o.path_.clear();
        return *this;
    }
    void swap(basic_fstream_dyad& o) {
        base::swap(o);
        std::swap(core_, o.core_);
        path_.swap(o.path_);
    }
    ~basic_fstream_dyad() override {
        if (this->is_open()) close();
    }

    // Reads existing contents (in, without trunc): consume first.
    void open(const std::string& path,
              std::ios_base::openmode mode = std::ios_base::in | std::ios_base::out) {
        if ((mode & std::ios_base::in) && !(mode & std::ios_base::trunc)) {
            if (!core_.open_sync(path.c_str())) {
                this->setstate(std::ios_base::failbit);
                return;
            }
        }
        base::open(path, mode);
        if (this->is_open() && (mode & (std::ios_base::out | std::ios_base::app))) path_ = path;
    }
    void open(const char* path,
              std::ios_base::openmode mode = std::ios_base::in | std::ios_base::out) {
        open(std::string(path), mode);
    }
    // Closes; a stream opened for writing is published.
    void close() { detail::close_and_publish(*this, static_cast<base&>(*this), core_, path_); }

    // The std stream (this object as one). Closing it there does not publish.
    base& get_stream() { return *this; }
    const base& get_stream() const { return *this; }
    void init(const dyad_stream_core& core) {
        core_ = core;
        core_.set_initialized();
        core_.log_info("Stream core state is set");
    }
    const dyad_stream_core& core() const { return core_; }

    dyad_rc_t dyad_rc() const { return core_.dyad_rc(); }
    const std::string& dyad_error() const { return core_.dyad_error(); }

  private:
    dyad_stream_core core_;
    std::string path_;
};

template <typename CharT, typename Traits>
void swap(basic_ifstream_dyad<CharT, Traits>& a, basic_ifstream_dyad<CharT, Traits>& b) {
    a.swap(b);
}
template <typename CharT, typename Traits>
void swap(basic_ofstream_dyad<CharT, Traits>& a, basic_ofstream_dyad<CharT, Traits>& b) {
    a.swap(b);
}
template <typename CharT, typename Traits>
void swap(basic_fstream_dyad<CharT, Traits>& a, basic_fstream_dyad<CharT, Traits>& b) {
    a.swap(b);
}

typedef basic_ifstream_dyad<char> ifstream_dyad;
typedef basic_ifstream_dyad<wchar_t> wifstream_dyad;
typedef basic_ofstream_dyad<char> ofstream_dyad;
typedef basic_ofstream_dyad<wchar_t> wofstream_dyad;
typedef basic_fstream_dyad<char> fstream_dyad;
typedef basic_fstream_dyad<wchar_t> wfstream_dyad;

typedef ifstream_dyad ifstream;
typedef wifstream_dyad wifstream;
typedef ofstream_dyad ofstream;
typedef wofstream_dyad wofstream;
typedef fstream_dyad fstream;
typedef wfstream_dyad wfstream;

}  // namespace dyad

#endif  // DYAD_STREAM_DYAD_STREAM_API_HPP
