#include "cluster/job_store.hpp"

#include <sqlite3.h>

#include <functional>
#include <mutex>

namespace troupe::cluster {

namespace {

constexpr const char* schema = R"sql(
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  state TEXT NOT NULL,
  spec_name TEXT NOT NULL,
  spec_text TEXT NOT NULL,
  resolved_config TEXT NOT NULL,
  job_dir TEXT NOT NULL,
  run_dir TEXT NOT NULL,
  submitter TEXT NOT NULL,
  submit_time_us INTEGER NOT NULL,
  start_time_us INTEGER NOT NULL,
  end_time_us INTEGER NOT NULL,
  error TEXT NOT NULL,
  exit_reason TEXT NOT NULL,
  driver_pid INTEGER NOT NULL,
  last_seq INTEGER NOT NULL,
  cores INTEGER NOT NULL,
  resume INTEGER NOT NULL,
  resumable INTEGER NOT NULL,
  stage TEXT NOT NULL,
  iteration INTEGER NOT NULL,
  total INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS transitions (
  job_id TEXT NOT NULL REFERENCES jobs(id),
  state TEXT NOT NULL,
  time_us INTEGER NOT NULL,
  reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS transitions_by_job ON transitions(job_id);
CREATE TABLE IF NOT EXISTS audit (
  time_us INTEGER NOT NULL,
  who TEXT NOT NULL,
  what TEXT NOT NULL,
  target TEXT NOT NULL,
  result TEXT NOT NULL
);
)sql";

// The columns of `jobs` in the order of bind_job / read_job.
constexpr const char* job_columns =
    "id, name, state, spec_name, spec_text, resolved_config, job_dir, run_dir, submitter, "
    "submit_time_us, start_time_us, end_time_us, error, exit_reason, driver_pid, last_seq, cores, "
    "resume, resumable, stage, iteration, total";

// A prepared statement, finalized on scope exit.
class statement {
public:
  statement(sqlite3* db, const std::string& sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr);
  }
  ~statement() { sqlite3_finalize(stmt_); }
  statement(const statement&) = delete;
  statement& operator=(const statement&) = delete;

  bool ok() const { return rc_ == SQLITE_OK; }
  void bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  void bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  /// SQLITE_ROW, SQLITE_DONE or an error code.
  int step() { return rc_ = sqlite3_step(stmt_); }
  std::string text(int col) const {
    auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, col));
    return p ? std::string{p, static_cast<size_t>(sqlite3_column_bytes(stmt_, col))} : std::string{};
  }
  int64_t integer(int col) const { return sqlite3_column_int64(stmt_, col); }
  caf::error error(const std::string& what) const {
    return make_error(errc::io_error, "job store: " + what + ": " + sqlite3_errmsg(db_));
  }

private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_OK;
};

void bind_job(statement& s, const job_record& r) {
  int i = 0;
  for (const auto* v : {&r.id, &r.name, &r.state, &r.spec_name, &r.spec_text, &r.resolved_config,
                        &r.job_dir, &r.run_dir, &r.submitter})
    s.bind(++i, *v);
  for (auto v : {r.submit_time_us, r.start_time_us, r.end_time_us})
    s.bind(++i, v);
  s.bind(++i, r.error);
  s.bind(++i, r.exit_reason);
  for (auto v : {r.driver_pid, r.last_seq, r.cores, static_cast<int64_t>(r.resume),
                 static_cast<int64_t>(r.resumable)})
    s.bind(++i, v);
  s.bind(++i, r.stage);
  s.bind(++i, r.iteration);
  s.bind(++i, r.total);
}

job_record read_job(const statement& s) {
  job_record r;
  int i = 0;
  for (auto* v : {&r.id, &r.name, &r.state, &r.spec_name, &r.spec_text, &r.resolved_config,
                  &r.job_dir, &r.run_dir, &r.submitter})
    *v = s.text(i++);
  for (auto* v : {&r.submit_time_us, &r.start_time_us, &r.end_time_us})
    *v = s.integer(i++);
  r.error = s.text(i++);
  r.exit_reason = s.text(i++);
  for (auto* v : {&r.driver_pid, &r.last_seq, &r.cores})
    *v = s.integer(i++);
  r.resume = s.integer(i++) != 0;
  r.resumable = s.integer(i++) != 0;
  r.stage = s.text(i++);
  r.iteration = s.integer(i++);
  r.total = s.integer(i++);
  return r;
}

} // namespace

struct job_store::impl {
  sqlite3* db = nullptr;
  std::mutex mu;

  ~impl() {
    if (db)
      sqlite3_close_v2(db);
  }

  caf::error exec(const char* sql, const std::string& what) {
    char* msg = nullptr;
    if (sqlite3_exec(db, sql, nullptr, nullptr, &msg) == SQLITE_OK)
      return {};
    std::string text = msg ? msg : "unknown error";
    sqlite3_free(msg);
    return make_error(errc::io_error, "job store: " + what + ": " + text);
  }

  // Runs a statement that returns no rows.
  expected<void> run(const std::string& sql, const std::function<void(statement&)>& bind,
                     const std::string& what) {
    statement s{db, sql};
    if (!s.ok())
      return s.error(what);
    bind(s);
    if (s.step() != SQLITE_DONE)
      return s.error(what);
    return {};
  }
};

job_store::~job_store() = default;

expected<std::unique_ptr<job_store>> job_store::open(const std::string& path) {
  std::unique_ptr<job_store> store{new job_store};
  store->impl_ = std::make_unique<impl>();
  auto& d = *store->impl_;
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX;
  if (sqlite3_open_v2(path.c_str(), &d.db, flags, nullptr) != SQLITE_OK)
    return make_error(errc::io_error, "job store: cannot open " + path + ": " +
                                          (d.db ? sqlite3_errmsg(d.db) : "out of memory"));
  sqlite3_busy_timeout(d.db, 5000);
  // WAL: commits append to the log; synchronous=NORMAL keeps every committed
  // transaction across a crash of the process (not of the machine's power).
  if (auto err = d.exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; "
                        "PRAGMA foreign_keys=ON;",
                        "setting WAL mode"))
    return err;
  if (auto err = d.exec(schema, "creating the schema"))
    return err;
  return store;
}

expected<void> job_store::insert(const job_record& r) {
  std::lock_guard lock{impl_->mu};
  return impl_->run(std::string{"INSERT INTO jobs ("} + job_columns +
                        ") VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    [&](statement& s) { bind_job(s, r); }, "inserting job " + r.id);
}

expected<void> job_store::update(const job_record& r) {
  std::lock_guard lock{impl_->mu};
  return impl_->run(std::string{"REPLACE INTO jobs ("} + job_columns +
                        ") VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    [&](statement& s) { bind_job(s, r); }, "updating job " + r.id);
}

expected<void> job_store::add_transition(const std::string& id, const transition_record& t) {
  std::lock_guard lock{impl_->mu};
  auto& d = *impl_;
  if (auto err = d.exec("BEGIN IMMEDIATE", "beginning a transaction"))
    return err;
  auto ok = d.run("INSERT INTO transitions (job_id, state, time_us, reason) VALUES (?,?,?,?)",
                  [&](statement& s) {
                    s.bind(1, id), s.bind(2, t.state), s.bind(3, t.time_us), s.bind(4, t.reason);
                  },
                  "recording a transition of " + id);
  if (ok)
    ok = d.run("UPDATE jobs SET state = ? WHERE id = ?",
               [&](statement& s) { s.bind(1, t.state), s.bind(2, id); }, "setting the state of " + id);
  if (auto err = d.exec(ok ? "COMMIT" : "ROLLBACK", "ending a transaction"))
    return err;
  return ok;
}

expected<std::vector<job_record>> job_store::jobs() {
  std::lock_guard lock{impl_->mu};
  statement s{impl_->db, std::string{"SELECT "} + job_columns + " FROM jobs ORDER BY submit_time_us, rowid"};
  if (!s.ok())
    return s.error("listing jobs");
  std::vector<job_record> out;
  while (s.step() == SQLITE_ROW)
    out.push_back(read_job(s));
  return out;
}

expected<std::optional<job_record>> job_store::find(const std::string& id) {
  std::lock_guard lock{impl_->mu};
  statement s{impl_->db, std::string{"SELECT "} + job_columns + " FROM jobs WHERE id = ?"};
  if (!s.ok())
    return s.error("reading job " + id);
  s.bind(1, id);
  if (s.step() == SQLITE_ROW)
    return std::optional<job_record>{read_job(s)};
  return std::optional<job_record>{};
}

expected<std::vector<transition_record>> job_store::transitions(const std::string& id) {
  std::lock_guard lock{impl_->mu};
  statement s{impl_->db,
              "SELECT state, time_us, reason FROM transitions WHERE job_id = ? ORDER BY rowid"};
  if (!s.ok())
    return s.error("reading the transitions of " + id);
  s.bind(1, id);
  std::vector<transition_record> out;
  while (s.step() == SQLITE_ROW)
    out.push_back({s.text(0), s.integer(1), s.text(2)});
  return out;
}

expected<void> job_store::audit(const audit_record& a) {
  std::lock_guard lock{impl_->mu};
  return impl_->run("INSERT INTO audit (time_us, who, what, target, result) VALUES (?,?,?,?,?)",
                    [&](statement& s) {
                      s.bind(1, a.time_us), s.bind(2, a.who), s.bind(3, a.what),
                          s.bind(4, a.target), s.bind(5, a.result);
                    },
                    "writing the audit log");
}

expected<std::vector<audit_record>> job_store::audit_log(int64_t limit) {
  std::lock_guard lock{impl_->mu};
  statement s{impl_->db, "SELECT time_us, who, what, target, result FROM (SELECT rowid AS r, * FROM "
                         "audit ORDER BY rowid DESC LIMIT ?) ORDER BY r"};
  if (!s.ok())
    return s.error("reading the audit log");
  s.bind(1, limit);
  std::vector<audit_record> out;
  while (s.step() == SQLITE_ROW)
    out.push_back({s.integer(0), s.text(1), s.text(2), s.text(3), s.text(4)});
  return out;
}

} // namespace troupe::cluster
