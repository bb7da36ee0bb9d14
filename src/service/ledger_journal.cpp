// SPDX-License-Identifier: Apache-2.0
#include "ledger_journal.hpp"

#include <sqlite3.h>

#include <cerrno>
#include <utility>

#include "common/paths.hpp"

namespace dyad::service {
namespace {

struct CloseDb {
    void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
struct FinalizeStmt {
    void operator()(sqlite3_stmt* st) const { sqlite3_finalize(st); }
};
using Db = std::unique_ptr<sqlite3, CloseDb>;
using Stmt = std::unique_ptr<sqlite3_stmt, FinalizeStmt>;

// The columns of a row, in the order of kSave's parameters 4..12.
constexpr const char* kSchema =
    "CREATE TABLE IF NOT EXISTS published ("
    " service TEXT NOT NULL, producer_dir TEXT NOT NULL, upath TEXT NOT NULL,"
    " ns TEXT NOT NULL, key TEXT NOT NULL, dev INTEGER NOT NULL, ino INTEGER NOT NULL,"
    " size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL,"
    " generation INTEGER NOT NULL, uid INTEGER NOT NULL DEFAULT -1,"
    " PRIMARY KEY (service, producer_dir, upath)) WITHOUT ROWID";
// A journal of a release before the producing uid was kept: the column is
// added (its rows: -1, unknown).
constexpr const char* kAddUid = "ALTER TABLE published ADD COLUMN uid INTEGER NOT NULL DEFAULT -1";
constexpr const char* kSave =
    "INSERT OR REPLACE INTO published VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)";
constexpr const char* kErase =
    "DELETE FROM published WHERE service = ?1 AND producer_dir = ?2 AND upath = ?3";
constexpr const char* kClear = "DELETE FROM published WHERE service = ?1 AND producer_dir = ?2";
constexpr const char* kLoad =
    "SELECT upath, ns, key, dev, ino, size, mtime_ns, ctime_ns, generation, uid FROM published"
    " WHERE service = ?1 AND producer_dir = ?2";

class SqliteJournal final : public LedgerJournal {
  public:
    SqliteJournal(std::string path, std::string id, std::string dir)
        : path_(std::move(path)), id_(std::move(id)), dir_(std::move(dir)) {}

    Status open() {
        sqlite3* raw = nullptr;
        int rc = sqlite3_open_v2(path_.c_str(), &raw,
                                 SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                                     SQLITE_OPEN_FULLMUTEX | SQLITE_OPEN_NOFOLLOW,
                                 nullptr);
        db_.reset(raw);
        if (rc != SQLITE_OK) return fail("cannot open", rc);
        // WAL with synchronous=NORMAL: a commit is one append to the log, no
        // fsync; it survives the process (SIGKILL), as the published files
        // themselves do, which DYAD does not fsync either. busy_timeout: a
        // second dyadd with this state directory waits for the lock.
        sqlite3_busy_timeout(db_.get(), 5000);
        for (const char* sql : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL", kSchema}) {
            rc = sqlite3_exec(db_.get(), sql, nullptr, nullptr, nullptr);
            if (rc != SQLITE_OK) return fail("cannot set up", rc);
        }
        if (!has_uid_column()) {
            rc = sqlite3_exec(db_.get(), kAddUid, nullptr, nullptr, nullptr);
            if (rc != SQLITE_OK) return fail("cannot set up", rc);
        }
        for (auto [stmt, sql] : {std::pair{&save_, kSave}, std::pair{&erase_, kErase},
                                 std::pair{&clear_, kClear}, std::pair{&load_, kLoad}}) {
            sqlite3_stmt* st = nullptr;
            rc = sqlite3_prepare_v3(db_.get(), sql, -1, SQLITE_PREPARE_PERSISTENT, &st, nullptr);
            stmt->reset(st);
            if (rc != SQLITE_OK) return fail("cannot set up", rc);
        }
        return Status::ok();
    }

    Result<Rows> load() override {
        sqlite3_stmt* st = bind_owner(load_);
        Rows rows;
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            Published p;
            p.ns = text(st, 1);
            p.key = text(st, 2);
            p.dev = static_cast<uint64_t>(sqlite3_column_int64(st, 3));
            p.ino = static_cast<uint64_t>(sqlite3_column_int64(st, 4));
            p.size = static_cast<uint64_t>(sqlite3_column_int64(st, 5));
            p.mtime_ns = sqlite3_column_int64(st, 6);
            p.ctime_ns = sqlite3_column_int64(st, 7);
            p.generation = static_cast<uint64_t>(sqlite3_column_int64(st, 8));
            p.uid = sqlite3_column_int64(st, 9);
            rows.emplace_back(text(st, 0), std::move(p));
        }
        sqlite3_reset(st);
        if (rc != SQLITE_DONE) return fail("cannot read", rc);
        return rows;
    }

    Status save(const std::string& up, const Published& pub) override {
        sqlite3_stmt* st = bind_owner(save_);
        bind_text(st, 3, up);
        bind_text(st, 4, pub.ns);
        bind_text(st, 5, pub.key);
        sqlite3_bind_int64(st, 6, static_cast<sqlite3_int64>(pub.dev));
        sqlite3_bind_int64(st, 7, static_cast<sqlite3_int64>(pub.ino));
        sqlite3_bind_int64(st, 8, static_cast<sqlite3_int64>(pub.size));
        sqlite3_bind_int64(st, 9, pub.mtime_ns);
        sqlite3_bind_int64(st, 10, pub.ctime_ns);
        sqlite3_bind_int64(st, 11, static_cast<sqlite3_int64>(pub.generation));
        sqlite3_bind_int64(st, 12, pub.uid);
        return run(st, "cannot write");
    }

    Status erase(const std::string& up) override {
        sqlite3_stmt* st = bind_owner(erase_);
        bind_text(st, 3, up);
        return run(st, "cannot write");
    }

    Status clear() override { return run(bind_owner(clear_), "cannot write"); }

    Status apply(const std::vector<LedgerChange>& changes) override {
        if (int rc = sqlite3_exec(db_.get(), "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
            rc != SQLITE_OK)
            return fail("cannot write", rc);
        Status s = LedgerJournal::apply(changes);
        int rc = sqlite3_exec(db_.get(), s ? "COMMIT" : "ROLLBACK", nullptr, nullptr, nullptr);
        if (s && rc != SQLITE_OK) return fail("cannot write", rc);
        return s;
    }

    Status replace(const Rows& rows) override {
        if (int rc = sqlite3_exec(db_.get(), "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
            rc != SQLITE_OK)
            return fail("cannot write", rc);
        Status s = clear();
        for (size_t i = 0; s && i < rows.size(); ++i) s = save(rows[i].first, rows[i].second);
        int rc = sqlite3_exec(db_.get(), s ? "COMMIT" : "ROLLBACK", nullptr, nullptr, nullptr);
        if (s && rc != SQLITE_OK) return fail("cannot write", rc);
        return s;
    }

    std::string describe() const override { return "'" + path_ + "'"; }

  private:
    static std::string text(sqlite3_stmt* st, int col) {
        const auto* p = sqlite3_column_text(st, col);
        return p ? std::string(reinterpret_cast<const char*>(p),
                               static_cast<size_t>(sqlite3_column_bytes(st, col)))
                 : std::string();
    }
    bool has_uid_column() {
        sqlite3_stmt* raw = nullptr;
        if (sqlite3_prepare_v2(db_.get(), "SELECT uid FROM published LIMIT 0", -1, &raw, nullptr) !=
            SQLITE_OK) {
            sqlite3_finalize(raw);
            return false;
        }
        sqlite3_finalize(raw);
        return true;
    }
    static void bind_text(sqlite3_stmt* st, int i, const std::string& s) {
        sqlite3_bind_text(st, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
    }
    sqlite3_stmt* bind_owner(const Stmt& stmt) {
        sqlite3_stmt* st = stmt.get();
        sqlite3_reset(st);
        sqlite3_clear_bindings(st);
        bind_text(st, 1, id_);
        bind_text(st, 2, dir_);
        return st;
    }
    Status run(sqlite3_stmt* st, const char* what) {
        int rc = sqlite3_step(st);
        sqlite3_reset(st);
        return rc == SQLITE_DONE ? Status::ok() : fail(what, rc);
    }
    Status fail(const char* what, int rc) const {
        std::string why = db_ ? sqlite3_errmsg(db_.get()) : sqlite3_errstr(rc);
        return Status(
            DYAD_RC_BADFIO,
            std::string(what) + " the publish ledger '" + path_ + "' (SQLite: " + why +
                "): it is dyadd's own; give dyadd a writable --state-dir, or move "
                "the file away (the files it lists are then not published again "
                "when this dyadd restarts)",
            rc == SQLITE_CANTOPEN || rc == SQLITE_READONLY || rc == SQLITE_PERM ? EACCES : EIO);
    }

    std::string path_, id_, dir_;
    Db db_;
    Stmt save_, erase_, clear_, load_;
};

}  // namespace

Result<std::unique_ptr<LedgerJournal>> open_sqlite_journal(const std::string& state_dir,
                                                           const std::string& id,
                                                           const std::string& producer_dir) {
    Status s = mkdir_p(state_dir, 0700);
    if (!s) return s.wrap("state directory: give dyadd a writable --state-dir");
    auto j = std::make_unique<SqliteJournal>(state_dir + "/" + kLedgerFile, id, producer_dir);
    if (Status o = j->open(); !o) return o;
    return std::unique_ptr<LedgerJournal>(std::move(j));
}

}  // namespace dyad::service
