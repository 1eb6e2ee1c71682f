#include "actors/job/tensorboard_sink.hpp"

#include "runtime/host.hpp"

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include <unistd.h>

namespace troupe::actors::job {

namespace {

constexpr std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

constexpr auto kCrcTable = crc32c_table();

// Protocol buffers' wire format, the few pieces an Event needs.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void key(std::string& out, int field, int wire_type) {
  varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type));
}

template <class T>
void fixed(std::string& out, int field, T v) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  key(out, field, sizeof(T) == 8 ? 1 : 5);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T)); // little-endian hosts (x86-64, aarch64)
  out.append(b, sizeof(T));
}

void bytes_field(std::string& out, int field, std::string_view v) {
  key(out, field, 2);
  varint(out, v.size());
  out.append(v);
}

void int_field(std::string& out, int field, int64_t v) {
  key(out, field, 0);
  varint(out, static_cast<uint64_t>(v));
}

// Event{wall_time, step} and the caller's remaining fields.
std::string event_head(int64_t time_us, int64_t step) {
  std::string e;
  fixed(e, 1, static_cast<double>(time_us) / 1e6);
  if (step != 0)
    int_field(e, 2, step);
  return e;
}

// The host name as a file name's part.
std::string host_name() {
  std::string h = runtime::host_name();
  for (auto& c : h)
    if (c == '/')
      c = '_';
  return h;
}

std::string le_bytes(uint64_t v, int n) {
  std::string out;
  for (int i = 0; i < n; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return out;
}

} // namespace

uint32_t crc32c(std::string_view bytes) noexcept {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : bytes)
    c = kCrcTable[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t masked_crc32c(std::string_view bytes) noexcept {
  uint32_t c = crc32c(bytes);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::shared_ptr<tensorboard_sink> tensorboard_sink::open(std::string dir) {
  std::shared_ptr<tensorboard_sink> s{new tensorboard_sink};
  s->dir_ = std::move(dir);
  return s;
}

tensorboard_sink::~tensorboard_sink() {
  if (f_)
    std::fclose(f_);
}

expected<void> tensorboard_sink::operator()(const event& e) {
  if (auto* s = std::get_if<stage_started>(&e.body)) {
    if (auto ok = start_file(*s); !ok)
      return ok;
    std::string v = event_head(e.time_us, 0);
    bytes_field(v, 3, "brain.Event:2");
    if (auto ok = write_record(v); !ok || s->from_step == 0)
      return ok;
    // SessionLog{status: START} at the first re-run step.
    std::string log;
    int_field(log, 1, 1);
    std::string restart = event_head(e.time_us, s->from_step + 1);
    bytes_field(restart, 7, log);
    return write_record(restart);
  }
  if (auto* m = std::get_if<metrics_reported>(&e.body)) {
    if (m->stage != stage_)
      if (auto ok = (*this)(event{0, e.time_us, stage_started{m->stage, m->total, 0}}); !ok)
        return ok;
    return write_scalars(*m, e.time_us);
  }
  return {};
}

expected<void> tensorboard_sink::start_file(const stage_started& s) {
  if (f_)
    std::fclose(f_), f_ = nullptr;
  stage_ = s.stage;
  auto dir = std::filesystem::path(dir_) / s.stage;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return make_error(errc::io_error, "cannot create " + dir.string() + ": " + ec.message());
  // TensorBoard reads a run's files in name order: time, then a counter.
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "%010lld", static_cast<long long>(std::time(nullptr)));
  char n[16];
  // Counted across the process: two jobs, or a run and its resume, in one
  // process and one second still get a file each.
  static std::atomic<int> files{0};
  std::snprintf(n, sizeof n, "%04d", files++);
  path_ = (dir / ("events.out.tfevents." + std::string(stamp) + "." + host_name() + "." +
                  std::to_string(::getpid()) + "." + n))
              .string();
  f_ = std::fopen(path_.c_str(), "ab");
  if (!f_)
    return make_error(errc::io_error, "cannot open " + path_ + ": " + std::strerror(errno));
  return {};
}

expected<void> tensorboard_sink::write_record(const std::string& bytes) {
  auto len = le_bytes(bytes.size(), 8);
  std::string rec = len + le_bytes(masked_crc32c(len), 4) + bytes + le_bytes(masked_crc32c(bytes), 4);
  if (std::fwrite(rec.data(), 1, rec.size(), f_) != rec.size() || std::fflush(f_) != 0)
    return make_error(errc::io_error, "cannot write " + path_ + ": " + std::strerror(errno));
  return {};
}

expected<void> tensorboard_sink::write_scalars(const metrics_reported& m, int64_t time_us) {
  std::string summary;
  for (const auto& [tag, v] : m.metrics) {
    std::string value;
    bytes_field(value, 1, tag);
    fixed(value, 2, static_cast<float>(v));
    bytes_field(summary, 1, value);
  }
  std::string e = event_head(time_us, m.step);
  bytes_field(e, 5, summary);
  return write_record(e);
}

} // namespace troupe::actors::job
