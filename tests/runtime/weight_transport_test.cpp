// Weight transports: every kind delivers bit-identical tensors and refuses
// stale, truncated, corrupted and partial versions; hash64 catches changes.
#include "runtime/collectives.hpp"
#include "runtime/hash.hpp"
#include "runtime/weight_transport.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace troupe;
using namespace troupe::runtime;

namespace {

// A small model's worth of tensors: several dtypes, odd sizes, one
// non-contiguous view, one empty tensor.
tensor_map sample_weights(int64_t seed) {
  torch::manual_seed(seed);
  tensor_map m;
  m["model.embed_tokens.weight"] = torch::randn({37, 16});
  m["model.layers.0.mlp.up_proj.weight"] = torch::randn({24, 16}).t(); // non-contiguous
  m["model.layers.0.input_layernorm.weight"] = torch::randn({16}).to(torch::kBFloat16);
  m["model.norm.weight"] = torch::randn({16}, torch::kDouble);
  m["rope.positions"] = torch::arange(0, 13, torch::kLong);
  m["empty"] = torch::empty({0, 4});
  return m;
}

// Bit-level equality: same names, dtypes, shapes and bytes.
void expect_identical(const tensor_map& sent, const tensor_map& got) {
  ASSERT_EQ(sent.size(), got.size());
  for (const auto& [name, t] : sent) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name;
    const auto& g = it->second;
    EXPECT_EQ(g.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(g.sizes(), t.sizes()) << name;
    auto a = t.contiguous();
    auto b = g.contiguous();
    ASSERT_EQ(a.numel(), b.numel()) << name;
    EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()), 0) << name;
  }
}

std::string unique_channel(const std::string& what) {
  return "test-" + what + "-" + std::to_string(::getpid());
}

std::unique_ptr<weight_transport> make(transport_options o) {
  auto t = make_weight_transport(o);
  EXPECT_TRUE(t) << (t ? "" : describe(t.error()));
  return t ? std::move(*t) : nullptr;
}

std::string error_text(const expected<received_weights>& r) {
  return r ? std::string{"(no error)"} : describe(r.error());
}

errc code(const expected<received_weights>& r) {
  return r ? errc::none : static_cast<errc>(r.error().code());
}

// Maps the shared-memory object of a shm slot read-write, for tampering.
struct raw_segment {
  int fd = -1;
  uint8_t* base = nullptr;
  size_t size = 0;
  explicit raw_segment(const std::string& name) {
    fd = ::shm_open(name.c_str(), O_RDWR, 0);
    struct stat st {};
    if (fd >= 0 && ::fstat(fd, &st) == 0) {
      size = static_cast<size_t>(st.st_size);
      base = static_cast<uint8_t*>(::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    }
  }
  ~raw_segment() {
    if (base != nullptr && base != MAP_FAILED)
      ::munmap(base, size);
    if (fd >= 0)
      ::close(fd);
  }
};

bool shm_exists(const std::string& name) {
  int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0)
    return false;
  ::close(fd);
  return true;
}

} // namespace

// ---- hash64 ------------------------------------------------------------------------

TEST(Hash64, CopyVariantCopiesAndAgrees) {
  std::vector<uint8_t> src(100'003);
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{31}, size_t{32}, size_t{33},
                   size_t{100}, src.size()}) {
    std::vector<uint8_t> dst(n + 1, 0xAB);
    auto h = hash64_copy(dst.data(), src.data(), n);
    EXPECT_EQ(h, hash64(src.data(), n)) << n;
    EXPECT_EQ(std::memcmp(dst.data(), src.data(), n), 0) << n;
    EXPECT_EQ(dst[n], 0xAB) << "wrote past the end at n=" << n;
  }
}

TEST(Hash64, EverySingleBitFlipChangesTheHash) {
  for (size_t n : {size_t{1}, size_t{9}, size_t{40}, size_t{77}}) {
    std::vector<uint8_t> buf(n, 0x5A);
    auto base = hash64(buf.data(), n);
    for (size_t byte = 0; byte < n; ++byte)
      for (int bit = 0; bit < 8; ++bit) {
        buf[byte] ^= static_cast<uint8_t>(1u << bit);
        EXPECT_NE(hash64(buf.data(), n), base) << "n=" << n << " byte " << byte << " bit " << bit;
        buf[byte] ^= static_cast<uint8_t>(1u << bit);
      }
  }
}

TEST(Hash64, LengthSeedAndStripeOrderMatter) {
  std::vector<uint8_t> zeros(64, 0);
  EXPECT_NE(hash64(zeros.data(), 63), hash64(zeros.data(), 64));
  EXPECT_NE(hash64(zeros.data(), 64, 1), hash64(zeros.data(), 64, 2));
  std::vector<uint8_t> a(64), b(64);
  for (int i = 0; i < 32; ++i) {
    a[i] = b[i + 32] = static_cast<uint8_t>(i);
    a[i + 32] = b[i] = static_cast<uint8_t>(100 + i);
  }
  EXPECT_NE(hash64(a.data(), 64), hash64(b.data(), 64)) << "swapped stripes collide";
  uint64_t parsed = 0;
  EXPECT_TRUE(parse_hex64(hex64(0x0123456789abcdefULL), parsed));
  EXPECT_EQ(parsed, 0x0123456789abcdefULL);
  EXPECT_FALSE(parse_hex64("0123", parsed));
  EXPECT_FALSE(parse_hex64("0123456789abcdeg", parsed));
}

// ---- every kind delivers the same bytes -----------------------------------------------

class TransportRoundTrip : public ::testing::TestWithParam<transport_kind> {};

TEST_P(TransportRoundTrip, DeliversBitIdenticalWeightsVersionAfterVersion) {
  test::temp_dir tmp;
  transport_options o;
  o.kind = GetParam();
  o.channel = unique_channel("roundtrip-" + std::string{to_string(GetParam())});
  o.dir = tmp.path().string();
  auto pub = make(o);
  auto sub = make(o);
  ASSERT_TRUE(pub && sub);
  EXPECT_EQ(pub->kind(), GetParam());
  for (int64_t v = 1; v <= 3; ++v) {
    auto w = sample_weights(v);
    ASSERT_TRUE(pub->publish(v, w));
    auto got = sub->receive(v);
    ASSERT_TRUE(got) << error_text(got);
    EXPECT_EQ(got->version, v);
    expect_identical(w, got->tensors);
    uint64_t bytes = 0;
    for (const auto& [n, t] : w)
      bytes += t.numel() * t.element_size();
    EXPECT_EQ(got->bytes, bytes);
  }
  // Versions only go up.
  auto again = pub->publish(3, sample_weights(9));
  ASSERT_FALSE(again);
  EXPECT_EQ(static_cast<errc>(again.error().code()), errc::version_mismatch);
}

INSTANTIATE_TEST_SUITE_P(Kinds, TransportRoundTrip,
                         ::testing::Values(transport_kind::alias, transport_kind::shm, transport_kind::disk),
                         [](const auto& info) { return std::string{to_string(info.param)}; });

TEST(WeightTransport, AliasSharesStorageAndChecksVersions) {
  transport_options o;
  o.kind = transport_kind::alias;
  o.channel = unique_channel("alias");
  auto sub = make(o);
  EXPECT_EQ(code(sub->receive(1)), errc::not_found);
  {
    auto pub = make(o);
    auto w = sample_weights(1);
    ASSERT_TRUE(pub->publish(4, w));
    auto got = sub->receive(4);
    ASSERT_TRUE(got);
    EXPECT_EQ(got->tensors.at("model.norm.weight").data_ptr(), w.at("model.norm.weight").data_ptr())
        << "alias copied";
    auto stale = sub->receive(5);
    EXPECT_EQ(code(stale), errc::version_mismatch);
    EXPECT_NE(error_text(stale).find("holds version 4, expected 5 (stale)"), std::string::npos)
        << error_text(stale);
    auto second = make(o);
    EXPECT_FALSE(second->publish(5, w)) << "two publishers on one alias channel";
  }
  EXPECT_EQ(code(sub->receive(4)), errc::not_found) << "the publisher's versions outlive it";
}

TEST(WeightTransport, RefusesBadOptions) {
  transport_options o;
  o.kind = static_cast<transport_kind>(enum_count<transport_kind>());
  EXPECT_FALSE(make_weight_transport(o));
  o.kind = transport_kind::shm;
  o.channel = "../etc";
  EXPECT_FALSE(make_weight_transport(o));
  o.channel = "ok";
  o.keep = 0;
  EXPECT_FALSE(make_weight_transport(o));
  o.keep = 2;
  o.kind = transport_kind::disk;
  EXPECT_FALSE(make_weight_transport(o)) << "disk without a dir";
  o.kind = transport_kind::broadcast;
  EXPECT_FALSE(make_weight_transport(o)) << "broadcast without a group";
}

// ---- shared memory ---------------------------------------------------------------------

TEST(ShmTransport, RefusesStaleAndOverwrittenVersions) {
  transport_options o;
  o.kind = transport_kind::shm;
  o.channel = unique_channel("shm-stale");
  auto pub = make(o);
  auto sub = make(o);
  EXPECT_EQ(code(sub->receive(1)), errc::not_found);
  for (int64_t v : {1, 2, 3})
    ASSERT_TRUE(pub->publish(v, sample_weights(v)));
  auto overwritten = sub->receive(1); // slot 1 now holds 3
  EXPECT_EQ(code(overwritten), errc::version_mismatch);
  EXPECT_NE(error_text(overwritten).find("holds version 3, expected 1 (already overwritten)"),
            std::string::npos)
      << error_text(overwritten);
  auto stale = sub->receive(4); // slot 0 holds 2
  EXPECT_EQ(code(stale), errc::version_mismatch);
  EXPECT_NE(error_text(stale).find("(stale)"), std::string::npos) << error_text(stale);
  EXPECT_TRUE(sub->receive(3));
}

TEST(ShmTransport, RefusesTruncatedCorruptedAndPartialSegments) {
  transport_options o;
  o.kind = transport_kind::shm;
  o.channel = unique_channel("shm-damage");
  auto pub = make(o);
  auto sub = make(o);
  auto seg = "/troupe." + o.channel + ".1";

  ASSERT_TRUE(pub->publish(1, sample_weights(1)));
  {
    raw_segment raw{seg};
    ASSERT_NE(raw.base, nullptr);
    raw.base[4096 + 5] ^= 0x01; // a byte of the first tensor
  }
  auto corrupted = sub->receive(1);
  EXPECT_EQ(code(corrupted), errc::corrupted);
  EXPECT_NE(error_text(corrupted).find("does not match its checksum"), std::string::npos)
      << error_text(corrupted);

  ASSERT_TRUE(pub->publish(3, sample_weights(3)));
  {
    raw_segment raw{seg};
    ASSERT_EQ(::ftruncate(raw.fd, static_cast<off_t>(raw.size - 100)), 0);
  }
  auto truncated = sub->receive(3);
  EXPECT_EQ(code(truncated), errc::corrupted);
  EXPECT_NE(error_text(truncated).find("truncated"), std::string::npos) << error_text(truncated);

  ASSERT_TRUE(pub->publish(5, sample_weights(5))); // resizes the segment back
  {
    raw_segment raw{seg};
    // The header's state word (after the 8-byte magic): a writer that died.
    uint64_t zero = 0;
    std::memcpy(raw.base + 8, &zero, sizeof zero);
  }
  auto partial = sub->receive(5);
  EXPECT_EQ(code(partial), errc::corrupted);
  EXPECT_NE(error_text(partial).find("partial"), std::string::npos) << error_text(partial);

  auto republished = pub->publish(7, sample_weights(7));
  ASSERT_TRUE(republished) << describe(republished.error());
  auto good = sub->receive(7);
  ASSERT_TRUE(good) << error_text(good);
  expect_identical(sample_weights(7), good->tensors);
}

TEST(ShmTransport, ASlotHeldByAReceiverIsNotRewritten) {
  transport_options o;
  o.kind = transport_kind::shm;
  o.channel = unique_channel("shm-held");
  o.keep = 1;
  o.timeout_ms = 200;
  auto pub = make(o);
  auto sub = make(o);
  auto w1 = sample_weights(1);
  ASSERT_TRUE(pub->publish(1, w1));
  {
    auto held = sub->receive(1);
    ASSERT_TRUE(held);
    auto blocked = pub->publish(2, sample_weights(2));
    ASSERT_FALSE(blocked);
    EXPECT_EQ(static_cast<errc>(blocked.error().code()), errc::timeout);
    EXPECT_NE(describe(blocked.error()).find("a receiver still holds slot 0"), std::string::npos)
        << describe(blocked.error());
    expect_identical(w1, held->tensors); // untouched while held
  }
  ASSERT_TRUE(pub->publish(2, sample_weights(2)));
  EXPECT_TRUE(sub->receive(2));
}

TEST(ShmTransport, ThePublisherRemovesItsSegments) {
  transport_options o;
  o.kind = transport_kind::shm;
  o.channel = unique_channel("shm-cleanup");
  {
    auto pub = make(o);
    ASSERT_TRUE(pub->publish(1, sample_weights(1)));
    ASSERT_TRUE(pub->publish(2, sample_weights(2)));
    EXPECT_TRUE(shm_exists("/troupe." + o.channel + ".0"));
    EXPECT_TRUE(shm_exists("/troupe." + o.channel + ".1"));
  }
  EXPECT_FALSE(shm_exists("/troupe." + o.channel + ".0"));
  EXPECT_FALSE(shm_exists("/troupe." + o.channel + ".1"));
}

// ---- disk ----------------------------------------------------------------------------

TEST(DiskTransport, RefusesTruncatedCorruptedStaleAndUnfinishedVersions) {
  test::temp_dir tmp;
  transport_options o;
  o.kind = transport_kind::disk;
  o.channel = "policy-to-rollout";
  o.dir = tmp.path().string();
  o.keep = 2;
  auto pub = make(o);
  auto sub = make(o);
  auto root = tmp.path() / o.channel;

  for (int64_t v : {1, 2, 3})
    ASSERT_TRUE(pub->publish(v, sample_weights(v)));
  EXPECT_FALSE(std::filesystem::exists(root / "v1")) << "keep=2 prunes older versions";
  auto pruned = sub->receive(1);
  EXPECT_EQ(code(pruned), errc::version_mismatch);
  EXPECT_NE(error_text(pruned).find("no longer kept"), std::string::npos) << error_text(pruned);
  auto ahead = sub->receive(9);
  EXPECT_EQ(code(ahead), errc::not_found);
  EXPECT_NE(error_text(ahead).find("present: 2, 3"), std::string::npos) << error_text(ahead);

  // A writer killed before its rename leaves only v4.tmp: not a version.
  std::filesystem::create_directories(root / "v4.tmp");
  EXPECT_EQ(code(sub->receive(4)), errc::not_found);

  auto file = root / "v3" / "model.safetensors";
  auto size = std::filesystem::file_size(file);
  {
    // Flip the file's last byte (tensor data).
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(size - 1));
    char c = 0;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(size - 1));
    f.put(static_cast<char>(c ^ 0x10));
  }
  auto corrupted = sub->receive(3);
  EXPECT_EQ(code(corrupted), errc::corrupted);
  EXPECT_NE(error_text(corrupted).find("does not match its checksum"), std::string::npos)
      << error_text(corrupted);

  std::filesystem::resize_file(root / "v2" / "model.safetensors",
                               std::filesystem::file_size(root / "v2" / "model.safetensors") - 8);
  auto truncated = sub->receive(2);
  EXPECT_EQ(code(truncated), errc::corrupted);
  EXPECT_NE(error_text(truncated).find("truncated"), std::string::npos) << error_text(truncated);

  // A new publish over the leftover v4.tmp works.
  ASSERT_TRUE(pub->publish(4, sample_weights(4)));
  auto good = sub->receive(4);
  ASSERT_TRUE(good) << error_text(good);
  expect_identical(sample_weights(4), good->tensors);
}

// ---- broadcast -------------------------------------------------------------------------

namespace {

// Two gloo ranks in one process, each used from its own thread.
struct two_ranks {
  local_groups set;
  process_group& g0;
  process_group& g1;
  static local_groups make_set() {
    group_options go;
    go.name = "transport-test";
    go.timeout_ms = 20000;
    auto s = make_local_groups(2, go);
    EXPECT_TRUE(s) << (s ? "" : describe(s.error()));
    return s ? std::move(*s) : local_groups{};
  }
  two_ranks() : set(make_set()), g0(set.groups.at(0)), g1(set.groups.at(1)) {}
};

constexpr int64_t wire_magic = 0x5452505742434132; // NOTE [broadcast wire]

// Sends a forged transfer from rank 0 with the raw group: header, payload,
// table length, table.
void forge(process_group& g, int64_t version, const std::string& table, at::Tensor payload,
           int64_t claimed_payload) {
  auto head =
      torch::tensor(std::vector<int64_t>{wire_magic, version, claimed_payload}, torch::kLong);
  ASSERT_TRUE(g.broadcast(head, 0));
  auto flat = payload.narrow(0, 0, claimed_payload).contiguous();
  ASSERT_TRUE(g.broadcast(flat, 0));
  auto length =
      torch::tensor(std::vector<int64_t>{static_cast<int64_t>(table.size())}, torch::kLong);
  ASSERT_TRUE(g.broadcast(length, 0));
  auto t = torch::from_blob(const_cast<char*>(table.data()), {static_cast<int64_t>(table.size())},
                            torch::kByte)
               .clone();
  ASSERT_TRUE(g.broadcast(t, 0));
}

} // namespace

TEST(BroadcastTransport, DeliversInBucketsAndStaysInStepAfterARejection) {
  two_ranks r;
  transport_options o;
  o.kind = transport_kind::broadcast;
  o.channel = "bcast";
  o.bucket_bytes = 1000; // many buckets, one tensor split across several
  o.group = &r.g0;
  auto root = make(o);
  o.group = &r.g1;
  auto peer = make(o);
  ASSERT_TRUE(root && peer);
  EXPECT_FALSE(root->receive(1)) << "the root cannot receive";

  auto w1 = sample_weights(1);
  auto got = std::async(std::launch::async, [&] { return peer->receive(1); });
  ASSERT_TRUE(root->publish(1, w1));
  auto r1 = got.get();
  ASSERT_TRUE(r1) << error_text(r1);
  expect_identical(w1, r1->tensors);

  // The receiver expects 3, the root sends 2: refused, and the group is
  // still usable.
  got = std::async(std::launch::async, [&] { return peer->receive(3); });
  ASSERT_TRUE(root->publish(2, sample_weights(2)));
  auto stale = got.get();
  EXPECT_EQ(code(stale), errc::version_mismatch);
  EXPECT_NE(error_text(stale).find("holds version 2, expected 3 (stale)"), std::string::npos)
      << error_text(stale);

  auto w3 = sample_weights(3);
  got = std::async(std::launch::async, [&] { return peer->receive(3); });
  ASSERT_TRUE(root->publish(3, w3));
  auto r3 = got.get();
  ASSERT_TRUE(r3) << error_text(r3);
  expect_identical(w3, r3->tensors);
}

TEST(BroadcastTransport, RefusesCorruptedAndTruncatedPayloads) {
  two_ranks r;
  transport_options o;
  o.kind = transport_kind::broadcast;
  o.channel = "bcast-forged";
  o.group = &r.g1;
  auto peer = make(o);
  ASSERT_TRUE(peer);
  auto values = torch::arange(0, 4, torch::kFloat);
  auto payload = torch::from_blob(values.data_ptr(), {16}, torch::kByte).clone();
  auto table = [&](uint64_t hash, int64_t payload_bytes) {
    return std::string{R"({"format":"troupe-weights/1","version":1,"payload_bytes":)"} +
           std::to_string(payload_bytes) +
           R"(,"tensors":[{"name":"w","dtype":"F32","shape":[4],"offset":0,"bytes":16,"hash":")" +
           hex64(hash) + R"("}]})";
  };
  auto good_hash = hash64(values.data_ptr(), 16);

  auto got = std::async(std::launch::async, [&] { return peer->receive(1); });
  forge(r.g0, 1, table(good_hash ^ 1, 16), payload, 16);
  auto corrupted = got.get();
  EXPECT_EQ(code(corrupted), errc::corrupted);
  EXPECT_NE(error_text(corrupted).find("tensor 'w' does not match its checksum"), std::string::npos)
      << error_text(corrupted);

  // The table promises 16 payload bytes, 12 arrive.
  got = std::async(std::launch::async, [&] { return peer->receive(1); });
  forge(r.g0, 1, table(good_hash, 16), payload, 12);
  auto truncated = got.get();
  EXPECT_EQ(code(truncated), errc::corrupted);
  EXPECT_NE(error_text(truncated).find("truncated"), std::string::npos) << error_text(truncated);

  // The forged wire itself is right: with the right hash it is accepted.
  got = std::async(std::launch::async, [&] { return peer->receive(1); });
  forge(r.g0, 1, table(good_hash, 16), payload, 16);
  auto ok = got.get();
  ASSERT_TRUE(ok) << error_text(ok);
  EXPECT_TRUE(torch::equal(ok->tensors.at("w"), values));
}

// NOTE [streamed publish]: the root sends a bucket as soon as the producer
// has filled it — a raw receiver gets the first bucket while the producer
// still waits for it to arrive before making the second tensor (without the
// overlap the producer would wait forever: bounded, 10 s, then the test
// fails) — and a producer that fails mid-publish fails its receivers with a
// clear error and leaves the group in step.
TEST(BroadcastTransport, AStreamedPublishSendsEachBucketAsItIsFilled) {
  two_ranks r;
  transport_options o;
  o.kind = transport_kind::broadcast;
  o.channel = "bcast-stream";
  o.bucket_bytes = 64; // a tensor of 16 floats a bucket
  o.group = &r.g0;
  auto root = make(o);
  o.group = &r.g1;
  auto peer = make(o);
  ASSERT_TRUE(root && peer);
  const auto a = torch::arange(0, 16, torch::kFloat), b = torch::arange(16, 32, torch::kFloat);
  const std::vector<tensor_spec> layout{{"a", at::kFloat, {16}}, {"b", at::kFloat, {4, 4}}};

  std::promise<void> first_arrived;
  auto arrived = first_arrived.get_future();
  auto raw = std::async(std::launch::async, [&] {
    auto head = torch::zeros({3}, torch::kLong);
    EXPECT_TRUE(r.g1.broadcast(head, 0));
    EXPECT_EQ(head[2].item<int64_t>(), 128);
    auto bucket = torch::empty({64}, torch::kByte);
    EXPECT_TRUE(r.g1.broadcast(bucket, 0));
    first_arrived.set_value();
    auto second = torch::empty({64}, torch::kByte);
    EXPECT_TRUE(r.g1.broadcast(second, 0));
    auto length = torch::zeros({1}, torch::kLong);
    EXPECT_TRUE(r.g1.broadcast(length, 0));
    auto table = torch::empty({length.item<int64_t>()}, torch::kByte);
    EXPECT_TRUE(r.g1.broadcast(table, 0));
    return torch::cat({bucket, second});
  });
  auto published = root->publish_streamed(1, layout, [&](const tensor_sink& put) -> expected<void> {
    put(0, a);
    if (arrived.wait_for(std::chrono::seconds(10)) != std::future_status::ready)
      return make_error(errc::timeout, "the first bucket did not go out before the second tensor");
    put(1, b.view({4, 4}));
    return {};
  });
  ASSERT_TRUE(published) << describe(published.error());
  auto bytes = raw.get();
  EXPECT_TRUE(torch::equal(bytes.view(torch::kFloat), torch::cat({a, b})));

  // The receiving transport gets the same as from a whole publish.
  auto got = std::async(std::launch::async, [&] { return peer->receive(2); });
  ASSERT_TRUE(root->publish_streamed(2, layout, [&](const tensor_sink& put) -> expected<void> {
    put(0, a);
    put(1, b.view({4, 4}));
    return {};
  }));
  auto r2 = got.get();
  ASSERT_TRUE(r2) << error_text(r2);
  EXPECT_TRUE(torch::equal(r2->tensors.at("a"), a));
  EXPECT_TRUE(torch::equal(r2->tensors.at("b"), b.view({4, 4})));

  // A producer that fails after its first tensor, one that skips a tensor:
  // the receivers fail clearly, and the next publish arrives.
  got = std::async(std::launch::async, [&] { return peer->receive(3); });
  auto failed = root->publish_streamed(3, layout, [&](const tensor_sink& put) -> expected<void> {
    put(0, a);
    return make_error(errc::io_error, "gathering unit 1 failed");
  });
  EXPECT_FALSE(failed);
  auto r3 = got.get();
  EXPECT_EQ(code(r3), errc::corrupted);
  EXPECT_NE(error_text(r3).find("the publisher failed mid-publish"), std::string::npos)
      << error_text(r3);
  got = std::async(std::launch::async, [&] { return peer->receive(4); });
  auto skipped = root->publish_streamed(4, layout, [&](const tensor_sink& put) -> expected<void> {
    put(1, b.view({4, 4}));
    return {};
  });
  ASSERT_FALSE(skipped);
  EXPECT_NE(describe(skipped.error()).find("tensor 'b' is not the layout's next"),
            std::string::npos)
      << describe(skipped.error());
  EXPECT_FALSE(got.get());
  got = std::async(std::launch::async, [&] { return peer->receive(5); });
  ASSERT_TRUE(root->publish_streamed(5, layout, [&](const tensor_sink& put) -> expected<void> {
    put(0, a);
    put(1, b.view({4, 4}));
    return {};
  }));
  auto r5 = got.get();
  ASSERT_TRUE(r5) << error_text(r5);
  EXPECT_TRUE(torch::equal(r5->tensors.at("a"), a));
}

TEST(WeightTransport, OrphanedSegmentsOfDeadProcessesAreRemoved) {
  // A pid that is surely gone: a child that has exited and been reaped.
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0)
    ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  auto make = [](const std::string& name) {
    int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
    ASSERT_GE(fd, 0) << name;
    ::close(fd);
  };
  auto dead = "/troupe.orphantest-" + std::to_string(child) + "-rl.0";
  auto live = "/troupe.orphantest-" + std::to_string(::getpid()) + "-rl.0";
  make(dead);
  make(live);
  EXPECT_EQ(remove_orphaned_shm_segments("orphantest-"), 1);
  EXPECT_FALSE(std::filesystem::exists("/dev/shm" + dead));
  EXPECT_TRUE(std::filesystem::exists("/dev/shm" + live));
  ::shm_unlink(live.c_str());
}
