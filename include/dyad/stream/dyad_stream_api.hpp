// C++ file streams that go through DYAD: opening for reading consumes the
// file first (waits until it is produced, then fetches it); closing a stream
// opened for writing produces (publishes) it. Header-only, over the public C
// API of libdyad.so; configuration comes from the same DYAD_* environment as
// everything else (no separate defaults).
//
// Errors: a failed consume or produce sets failbit; dyad_rc() and
// dyad_error() say what happened. No exception is thrown unless the stream's
// exceptions() mask asks for it.
//
// Names: dyad::ifstream, dyad::ofstream, dyad::fstream (and w- variants), and
// DYAD's ifstream_dyad, ofstream_dyad, fstream_dyad, wifstream_dyad, ...
#ifndef DYAD_STREAM_DYAD_STREAM_API_HPP
#define DYAD_STREAM_DYAD_STREAM_API_HPP

#include <fstream>
#include <string>

#include <dyad/client/dyad_client.h>
#include <dyad/core/dyad_ctx.h>

namespace dyad {

// The DYAD side of a stream: consume before opening, produce after closing.
class stream_core {
  public:
    // The process's DYAD context, initialised from the environment on first use.
    static dyad_ctx_t* context() {
        dyad_ctx_t* c = dyad_ctx_get();
        if (!c) {
            dyad_init_env(DYAD_COMM_RECV, nullptr);
            c = dyad_ctx_get();
        }
        return c;
    }
    // A process that is not a DYAD consumer (or producer) opens files as
    // plain streams: "no context" and "no such managed directory" are not
    // errors here.
    dyad_rc_t open_sync(const std::string& path) {
        return record(pass(dyad_consume(context(), path.c_str())));
    }
    dyad_rc_t close_sync(const std::string& path) {
        return record(pass(dyad_produce(context(), path.c_str())));
    }
    dyad_rc_t rc() const { return rc_; }
    const std::string& error() const { return error_; }

    // Closes `stream` (a std file stream) and publishes `path` unless it is
    // empty (not opened for writing) or a write failed; a failed publish
    // sets failbit.
    template <typename Stream, typename Base>
    void close_and_publish(Stream& stream, Base& base, std::string& path) {
        if (!stream.is_open()) return;
        base.close();
        std::string p;
        p.swap(path);
        if (p.empty() || stream.fail()) return;  // never publish a failed write
        if (DYAD_IS_ERROR(close_sync(p))) stream.setstate(std::ios_base::failbit);
    }

  private:
    static dyad_rc_t pass(dyad_rc_t rc) {
        return (rc == DYAD_RC_NOCTX || rc == DYAD_RC_BADMANAGEDPATH) ? DYAD_RC_OK : rc;
    }
    dyad_rc_t record(dyad_rc_t rc) {
        rc_ = rc;
        error_ = DYAD_IS_ERROR(rc) ? std::string(dyad_last_error()) : std::string();
        return rc;
    }
    dyad_rc_t rc_ = DYAD_RC_OK;
    std::string error_;
};

template <typename CharT, typename Traits = std::char_traits<CharT>>
class basic_ifstream_dyad : public std::basic_ifstream<CharT, Traits> {
    using base = std::basic_ifstream<CharT, Traits>;

  public:
    basic_ifstream_dyad() = default;
    explicit basic_ifstream_dyad(const std::string& path,
                                 std::ios_base::openmode mode = std::ios_base::in) {
        open(path, mode);
    }
    explicit basic_ifstream_dyad(const char* path,
                                 std::ios_base::openmode mode = std::ios_base::in) {
        open(std::string(path), mode);
    }
    void open(const std::string& path, std::ios_base::openmode mode = std::ios_base::in) {
        if (DYAD_IS_ERROR(core_.open_sync(path))) {
            this->setstate(std::ios_base::failbit);
            return;
        }
        base::open(path, mode);
    }
    void open(const char* path, std::ios_base::openmode mode = std::ios_base::in) {
        open(std::string(path), mode);
    }
    dyad_rc_t dyad_rc() const { return core_.rc(); }
    const std::string& dyad_error() const { return core_.error(); }

  private:
    stream_core core_;
};

template <typename CharT, typename Traits = std::char_traits<CharT>>
class basic_ofstream_dyad : public std::basic_ofstream<CharT, Traits> {
    using base = std::basic_ofstream<CharT, Traits>;

  public:
    basic_ofstream_dyad() = default;
    explicit basic_ofstream_dyad(const std::string& path,
                                 std::ios_base::openmode mode = std::ios_base::out) {
        open(path, mode);
    }
    explicit basic_ofstream_dyad(const char* path,
                                 std::ios_base::openmode mode = std::ios_base::out) {
        open(std::string(path), mode);
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
    void close() { core_.close_and_publish(*this, static_cast<base&>(*this), path_); }
    dyad_rc_t dyad_rc() const { return core_.rc(); }
    const std::string& dyad_error() const { return core_.error(); }

  private:
    stream_core core_;
    std::string path_;
};

template <typename CharT, typename Traits = std::char_traits<CharT>>
class basic_fstream_dyad : public std::basic_fstream<CharT, Traits> {
    using base = std::basic_fstream<CharT, Traits>;
    static constexpr std::ios_base::openmode kDefault = std::ios_base::in | std::ios_base::out;

  public:
    basic_fstream_dyad() = default;
    explicit basic_fstream_dyad(const std::string& path, std::ios_base::openmode mode = kDefault) {
        open(path, mode);
    }
    explicit basic_fstream_dyad(const char* path, std::ios_base::openmode mode = kDefault) {
        open(std::string(path), mode);
    }
    ~basic_fstream_dyad() override {
        if (this->is_open()) close();
    }
    // Reads existing contents (in, without trunc): consume first.
    void open(const std::string& path, std::ios_base::openmode mode = kDefault) {
        if ((mode & std::ios_base::in) && !(mode & std::ios_base::trunc)) {
            if (DYAD_IS_ERROR(core_.open_sync(path))) {
                this->setstate(std::ios_base::failbit);
                return;
            }
        }
        base::open(path, mode);
        if (this->is_open() && (mode & (std::ios_base::out | std::ios_base::app))) path_ = path;
    }
    void open(const char* path, std::ios_base::openmode mode = kDefault) {
        open(std::string(path), mode);
    }
    // Closes; a stream opened for writing is published.
    void close() { core_.close_and_publish(*this, static_cast<base&>(*this), path_); }
    dyad_rc_t dyad_rc() const { return core_.rc(); }
    const std::string& dyad_error() const { return core_.error(); }

  private:
    stream_core core_;
    std::string path_;
};

using ifstream_dyad = basic_ifstream_dyad<char>;
using wifstream_dyad = basic_ifstream_dyad<wchar_t>;
using ofstream_dyad = basic_ofstream_dyad<char>;
using wofstream_dyad = basic_ofstream_dyad<wchar_t>;
using fstream_dyad = basic_fstream_dyad<char>;
using wfstream_dyad = basic_fstream_dyad<wchar_t>;

using ifstream = ifstream_dyad;
using wifstream = wifstream_dyad;
using ofstream = ofstream_dyad;
using wofstream = wofstream_dyad;
using fstream = fstream_dyad;
using wfstream = wfstream_dyad;

}  // namespace dyad

#endif  // DYAD_STREAM_DYAD_STREAM_API_HPP
